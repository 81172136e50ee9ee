-- Where each record's message id came from (issue 27 part 4; docs/DESIGN.md, "Reused ids and
-- payload conflicts"): the kind of the group's `ids.from` source that gave it, one byte —
-- `p` the AMQP message_id property, `h` a header, `k` the Kafka record key, `j` a payload field,
-- `o` the Kafka offset. The record page says "id from key", so an operator sees at once an id
-- source that is not unique per event. NULL for records from before this column (until a
-- claim takes one over) and for poison messages stored under a synthetic id. A nullable column
-- without a default is added without rewriting the table.
ALTER TABLE dedup_records ADD COLUMN id_source "char";
