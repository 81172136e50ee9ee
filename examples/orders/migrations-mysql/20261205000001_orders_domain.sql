-- The order example on MySQL 8 / MariaDB 10.11 (issue 25): the tables of the PostgreSQL
-- migration 20261202000002 in MySQL's terms, as the engine's MySQL migrations write them. Keys
-- and compared text are utf8mb4_bin or VARBINARY (byte comparison: no collation folds case, no
-- PAD SPACE makes 'a' equal 'a '); times are DATETIME(6) in UTC (UTC_TIMESTAMP(6), never NOW());
-- InnoDB. Reservations and payments are deliberately not unique per order: a double effect must
-- stay visible to `dedup-console verify`, not be hidden by a key.

CREATE TABLE IF NOT EXISTS inventory (
    sku       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- text key → _bin
    available INT NOT NULL,
    reserved  INT NOT NULL DEFAULT 0,
    PRIMARY KEY (sku),
    CONSTRAINT inventory_available_check CHECK (available >= 0),
    CONSTRAINT inventory_reserved_check CHECK (reserved >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS orders (
    order_no     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- text key → _bin
    status       VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,       -- text + CHECK, as PostgreSQL
    sku          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    quantity     INT NOT NULL,
    amount_cents BIGINT NOT NULL,
    phone        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- compared by CREATE's replay: _bin
    -- Optimistic version for the state machine: PENDING is 1, PAID is 2.
    version      INT NOT NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),               -- timestamptz → DATETIME(6) UTC
    paid_at      DATETIME(6) NULL,
    PRIMARY KEY (order_no),
    CONSTRAINT orders_sku_fkey FOREIGN KEY (sku) REFERENCES inventory (sku),
    CONSTRAINT orders_status_check CHECK (status IN ('PENDING', 'PAID')),
    CONSTRAINT orders_quantity_check CHECK (quantity > 0),
    CONSTRAINT orders_amount_cents_check CHECK (amount_cents >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS inventory_reservations (
    id          BIGINT NOT NULL AUTO_INCREMENT,                                  -- identity → AUTO_INCREMENT
    order_no    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    sku         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    quantity    INT NOT NULL,
    message_id  VARBINARY(512) NOT NULL,                                         -- as the engine's dedup_records.message_id
    reserved_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    KEY inventory_reservations_order_idx (order_no),
    KEY inventory_reservations_sku_idx (sku)                                     -- the verifier's sum per SKU
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS payments (
    id           BIGINT NOT NULL AUTO_INCREMENT,
    order_no     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    amount_cents BIGINT NOT NULL,
    message_id   VARBINARY(512) NOT NULL,
    paid_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    KEY payments_order_idx (order_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every SMS the gateway stand-in accepted, in its own table (written outside the consumer's
-- transaction, like a real gateway), so double sends can be counted.
CREATE TABLE IF NOT EXISTS notifications (
    id         BIGINT NOT NULL AUTO_INCREMENT,
    order_no   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kind       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,  -- grouped by the verifier: _bin
    phone      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    body       TEXT CHARACTER SET utf8mb4 NOT NULL,                              -- free text, never compared
    message_id VARBINARY(512) NOT NULL,
    sent_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    KEY notifications_order_idx (order_no, kind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
