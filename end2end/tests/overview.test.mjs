import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, launchBrowser, login, screenshot, waitForHydration } from './support/harness.mjs';

let server;
let browser;

before(async () => {
  server = await startServer();
  browser = await launchBrowser();
  await login(browser, server, server.users.viewer);
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

test('overview hydrates and its refresh button fetches the health again', async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(server.base + '/');
  await waitForHydration(page);

  const rows = page.locator('[data-testid="health-table"] tbody tr');
  assert.equal(await rows.count(), 3);
  for (const key of ['database', 'redis', 'broker']) {
    assert.equal(await page.locator(`tr[data-dependency="${key}"]`).getAttribute('data-state'), 'up', key);
  }
  const before = await page.getByTestId('checked-at').textContent();

  await page.getByTestId('refresh-health').click();
  await page.getByText('refreshed 1×').waitFor();
  await page.waitForFunction(
    (old) => document.querySelector('[data-testid="checked-at"]')?.textContent !== old,
    before,
  );
  const after = await page.getByTestId('checked-at').textContent();
  assert.ok(after > before, `checked-at moved forward: ${before} -> ${after}`);

  // This serve process among the instances: live, reading its queue (its own row shows its
  // consumers as they are now; its first heartbeat was written before its workers connected).
  const instance = page.locator('[data-testid="instance"]').filter({ hasText: 'this process' });
  assert.equal(await instance.count(), 1, await page.locator('[data-testid="instances"]').innerText());
  assert.equal(await instance.getByTestId('instance-state').innerText(), 'live');
  assert.match(await instance.getByTestId('instance-owns').innerText(), /^queue /, 'as it is now, not at its first beat');

  await screenshot(page, 'overview');
  assert.deepEqual(errors, [], 'no script errors');
});

test('navigation links work without a full reload after hydration', async () => {
  const page = await browser.newPage();
  await page.goto(server.base + '/');
  await waitForHydration(page);
  await page.evaluate(() => { window.__sameDocument = true; });
  // Each page's list comes from its server function, called with no filter (an empty body).
  for (const [name, path] of [['Audit', '/audit'], ['Records', '/records']]) {
    await page.getByRole('link', { name, exact: true }).click();
    await page.getByRole('heading', { name, exact: true }).waitFor();
    await page.waitForSelector('main table, main .empty, main .error');
    assert.equal(new URL(page.url()).pathname, path);
    assert.equal(await page.locator('main .error').count(), 0, await page.locator('main').innerText());
  }
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'client-side navigation');
});
