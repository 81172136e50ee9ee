-- First deliveries (no record yet) older than the shortest retention of the cleanup schedules
-- when they arrived, by their own timestamp (AMQP `timestamp`, Kafka record time): most likely
-- duplicates of records cleanup had deleted, whose handlers then ran again. Per day and group;
-- the Cleanup page warns while there are any, and their ages also feed the retention advice.
CREATE TABLE late_deliveries (
    day            DATE NOT NULL,
    consumer_group TEXT NOT NULL,
    count          BIGINT NOT NULL,
    max_age_ms     BIGINT NOT NULL,
    PRIMARY KEY (day, consumer_group)
);
