// The console inside another application: the billing example mounts it at /ops/dedup behind its
// own staff sign-in. Chromium signs in through the host, sees the billing group's records,
// releases a stuck record, requeues a dead letter and opens every page under the prefix — every
// request inside the prefix (or the host's own sign-in), no 404, no console error.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startBilling, launchBrowser, screenshot, waitForHydration } from './support/harness.mjs';

const PREFIX = '/ops/dedup';
const ADMIN = { name: 'ada', password: 'ada-password-2026' };
const OPERATOR = { name: 'olivia', password: 'olivia-password-2026' };

let billing;
let browser;
/** Every request, response status and console message of every page, checked after each test. */
const network = [];
const problems = [];

before(async () => {
  billing = await startBilling(`${ADMIN.name}:admin:${ADMIN.password},${OPERATOR.name}:operator:${OPERATOR.password}`);
  billing.cli(['publish', '--invoices', '5', '--duplicate-rate', '0.4']);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await billing?.stop();
});

/** A new page whose traffic and console are recorded. */
async function watched() {
  const page = await browser.newPage();
  page.on('request', (r) => network.push(r.url()));
  page.on('response', (r) => {
    if (r.status() === 404) problems.push(`404 ${r.url()}`);
  });
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()} (${m.location().url})`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  return page;
}

/** Signs `who` in through the host's sign-in form, landing on `path` under the prefix. */
async function signIn(who, path) {
  await browser.clearCookies();
  const page = await watched();
  await page.goto(`${billing.base}${PREFIX}${path}`);
  assert.equal(new URL(page.url()).pathname, '/signin', 'the host signs visitors in');
  await page.fill('input[name="name"]', who.name);
  await page.fill('input[name="password"]', who.password);
  await Promise.all([page.waitForURL((u) => u.pathname.startsWith(PREFIX)), page.click('button[type="submit"]')]);
  await waitForHydration(page);
  return page;
}

function assertClean() {
  const outside = network.filter((u) => {
    const { pathname } = new URL(u);
    return !pathname.startsWith(`${PREFIX}/`) && pathname !== PREFIX && pathname !== '/signin' && !u.startsWith('data:');
  });
  assert.deepEqual(outside, [], 'requests outside the prefix');
  assert.deepEqual(problems, [], '404s and console errors');
}

/** A stuck receipt of the billing group; returns its id. */
function stuckReceipt() {
  return billing.sql(`INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode,
      attempts, max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers,
      content_type, source_broker, source_exchange, source_routing_key)
    VALUES ('billing', '20991231000001:RECEIPT:3', 'INVOICE.RECEIPT', 'processing', 'leased', 1, 5, 'w:1',
      gen_random_uuid(), now() - interval '5 minutes', '\\x00',
      convert_to('{"invoiceNo": "20991231000001", "email": "x@example.com"}', 'UTF8'),
      '{"__TypeId__": "com.example.billing.InvoiceReceiptEvent"}', 'application/json', 'rabbitmq',
      '${billing.exchange}', 'invoice.receipt')
    RETURNING id`);
}

/** A dead letter of a type the billing group has no handler for; returns its id. */
function deadLetter() {
  return billing.sql(`INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts,
      max_attempts, payload_hash, payload, headers, content_type, source_broker, source_exchange,
      source_routing_key, last_error, error_class)
    VALUES ('billing', '20991231000002:VOID:4', 'com.example.billing.InvoiceVoidedEvent', 'dead', 0, 5, '\\x01',
      convert_to('{"invoiceNo": "20991231000002"}', 'UTF8'),
      '{"__TypeId__": "com.example.billing.InvoiceVoidedEvent"}', 'application/json', 'rabbitmq',
      '${billing.exchange}', 'invoice.voided', 'no handler for message type "com.example.billing.InvoiceVoidedEvent"',
      'NO_HANDLER: com.example.billing.InvoiceVoidedEvent')
    RETURNING id`);
}

test('signed in through the host, an operator sees the billing records, releases and requeues', async () => {
  const page = await signIn(OPERATOR, '/records?group=billing');
  await page.waitForSelector('[data-testid="records-table"] tbody tr');
  assert.ok((await page.locator('[data-testid="records-table"] tbody tr').count()) >= 10, 'the invoices\' records');
  const table = await page.innerText('[data-testid="records-table"]');
  assert.match(table, /billing/);
  assert.match(table, /INVOICE\.RECEIPT/);
  assert.match(await page.innerText('[data-testid="userbox"]'), /olivia/);
  await screenshot(page, 'billing-records');

  const stuck = stuckReceipt();
  await page.goto(`${billing.base}${PREFIX}/stuck`);
  await waitForHydration(page);
  await page.goto(`${billing.base}${PREFIX}/records/${stuck}`);
  await waitForHydration(page);
  await page.click('[data-testid="record-actions"] button[data-action="Release"]');
  await page.locator('[data-testid="confirm-reason"]').fill('the mail log has no call for it');
  await page.locator('[data-testid="confirm-submit"]').click();
  await page.waitForSelector('[data-testid="action-result"]');
  assert.match(await page.innerText('[data-testid="action-result"]'), /is failed now/);
  await page.click('[data-testid="confirm-cancel"]');

  const dead = deadLetter();
  await page.goto(`${billing.base}${PREFIX}/records/${dead}`);
  await waitForHydration(page);
  await page.click('[data-testid="record-actions"] button[data-action="Requeue"]');
  await page.locator('[data-testid="confirm-submit"]').click();
  await page.waitForSelector('[data-testid="action-result"]');
  assert.match(await page.innerText('[data-testid="action-result"]'), /published again/);
  await screenshot(page, 'billing-requeued');
  const actors = billing.sql(`SELECT string_agg(DISTINCT actor, ',') FROM audit_log WHERE outcome = 'ok'`);
  assert.equal(actors, 'host:olivia', 'the audit log names the host\'s user');
  assertClean();
});

test('every page of the console opens under the prefix', async () => {
  const dead = billing.sql(`SELECT id FROM dedup_records WHERE consumer_group = 'billing' ORDER BY id LIMIT 1`);
  const page = await signIn(ADMIN, '/');
  for (const path of ['/', '/records', `/records/${dead}`, '/stuck', '/retries', '/dead-letters', '/requeue',
    '/cleanup', '/audit', '/account', '/users']) {
    const response = await page.goto(`${billing.base}${PREFIX}${path}`);
    assert.equal(response.status(), 200, path);
    await waitForHydration(page);
    assert.ok(new URL(page.url()).pathname.startsWith(PREFIX), `${path} stays under the prefix`);
  }
  // Client-side navigation stays under the prefix too.
  await page.click('nav a:has-text("Dead letters")');
  await page.waitForURL(`${billing.base}${PREFIX}/dead-letters`);
  await screenshot(page, 'billing-dead-letters');
  assertClean();
});
