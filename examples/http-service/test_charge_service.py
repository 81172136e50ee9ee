"""Unit tests of the charge service: the Idempotency-Key parser, the Standard Webhooks check, and
the key's rules over a real SQLite file. Run: python3 -m unittest discover -s examples/http-service
(the gateway in front of it is tested by server/tests/consumer/http_service.rs)."""

import hashlib
import json
import os
import tempfile
import threading
import time
import unittest
from contextlib import closing

from charge_service import ChargeService, KeyError400, parse_idempotency_key, signature_problem, webhook_key

# The example of the Standard Webhooks specification (the gateway's own test signs it too).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


class IdempotencyKeys(unittest.TestCase):
    def test_sf_strings_and_display_strings(self):
        self.assertEqual(parse_idempotency_key('"ORDER.PAY.1:2"'), "ORDER.PAY.1:2")
        self.assertEqual(parse_idempotency_key(r'"a\"b\\c"'), 'a"b\\c')
        self.assertEqual(parse_idempotency_key(' "k";v=1 '), "k", "parameters are ignored")
        self.assertEqual(parse_idempotency_key('%"caf%c3%a9 100%25"'), "café 100%")

    def test_anything_else_is_refused(self):
        for value in [None, "", "bare", '"open', '""', '"a"b', r'"a\x"', '"tab\t"', '%"%C3"', '%"%c"']:
            with self.assertRaises(KeyError400, msg=repr(value)):
                parse_idempotency_key(value)


class Signatures(unittest.TestCase):
    def headers(self, signature=SPEC_SIGNATURE):
        return {"webhook-id": SPEC_ID, "webhook-timestamp": str(SPEC_TIMESTAMP), "webhook-signature": signature}

    def test_the_specifications_example_checks_out(self):
        key = webhook_key(SPEC_SECRET)
        self.assertIsNone(signature_problem(key, self.headers(), SPEC_BODY, now=SPEC_TIMESTAMP))
        self.assertIsNone(signature_problem(key, self.headers("v1,bm90IGl0 " + SPEC_SIGNATURE), SPEC_BODY,
                                            now=SPEC_TIMESTAMP), "any of several signatures")

    def test_a_changed_body_an_old_timestamp_or_no_headers_do_not(self):
        key = webhook_key(SPEC_SECRET)
        self.assertIn("matches", signature_problem(key, self.headers(), b'{"test": 1}', now=SPEC_TIMESTAMP))
        self.assertIn("5 minutes", signature_problem(key, self.headers(), SPEC_BODY, now=SPEC_TIMESTAMP + 301))
        self.assertIn("required", signature_problem(key, {}, SPEC_BODY, now=SPEC_TIMESTAMP))


class Charges(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "charges.sqlite3")
        self.service = ChargeService(self.path)

    def tearDown(self):
        self.dir.cleanup()

    def charge(self, key, order_no=1, amount=100, service=None):
        body = json.dumps({"orderNo": order_no, "amountCents": amount}).encode()
        return (service or self.service).charge({"idempotency-key": f'"{key}"'}, body)

    def test_a_key_is_charged_once_and_its_first_answer_replayed(self):
        status, first, _ = self.charge("k1")
        self.assertEqual(status, 201)
        status, again, headers = self.charge("k1")
        self.assertEqual((status, again, headers), (201, first, {"Idempotent-Replayed": "true"}))
        self.assertEqual(self.charge("k1", amount=200)[0], 422, "another payload")
        self.assertEqual(len(self.service.charges()), 1)

    def test_a_key_in_flight_gets_409_and_one_abandoned_by_a_dead_process_is_taken_over(self):
        self.service.set_mode("hang", hang_seconds=1.0)
        first = threading.Thread(target=self.charge, args=("k2",))
        first.start()
        time.sleep(0.3)
        status, _, headers = self.charge("k2")
        self.assertEqual((status, headers), (409, {"Retry-After": "1"}))
        first.join()
        self.assertEqual(self.charge("k2")[2], {"Idempotent-Replayed": "true"})
        # A process killed mid-charge leaves its key in flight, and no charge: the next one takes it.
        body = json.dumps({"orderNo": 1, "amountCents": 100}).encode()
        with closing(self.service.connect()) as db:
            db.execute("INSERT INTO idempotency_keys (key, request_hash, owner) VALUES ('k3', ?, 'a dead process')",
                       (hashlib.sha256(body).hexdigest(),))
        self.assertEqual(self.charge("k3", amount=200)[0], 422, "its payload is still compared")
        status, _, headers = self.charge("k3")
        self.assertEqual((status, headers), (201, {}), "taken over and charged")
        self.assertEqual([c["idempotencyKey"] for c in self.service.charges()], ["k2", "k3"])

    def test_injected_failures_store_nothing(self):
        self.service.set_mode("error")
        self.assertEqual(self.charge("k4")[0], 500)
        self.service.set_mode("fail")
        self.assertEqual(self.charge("k4")[0], 402)
        self.service.set_mode("ok")
        status, text, headers = self.charge("k4")
        self.assertEqual((status, headers), (201, {}), "charged now, not replayed")
        self.assertEqual(json.loads(text)["orderNo"], "1")
        with self.assertRaises(ValueError):
            self.service.set_mode("sleepy")

    def test_a_body_without_an_amount_is_refused(self):
        status, _, _ = self.service.charge({"idempotency-key": '"k5"'}, b'{"orderNo": 1}')
        self.assertEqual(status, 400)
        status, _, _ = self.service.charge({}, b'{"orderNo": 1, "amountCents": 1}')
        self.assertEqual(status, 400)


if __name__ == "__main__":
    unittest.main()
