-- Databases from before this example had a schema of its own kept its tables in `public` (the
-- engine's migrations created them then). Move them here, rows and all; the next migrations
-- create only what is still missing.
DO $$
DECLARE
    t TEXT;
BEGIN
    FOREACH t IN ARRAY ARRAY['inventory', 'orders', 'inventory_reservations', 'payments', 'notifications',
                             'simulation_runs', 'simulation_messages'] LOOP
        IF to_regclass(format('public.%I', t)) IS NOT NULL
           AND to_regclass(format('%I.%I', current_schema(), t)) IS NULL THEN
            EXECUTE format('ALTER TABLE public.%I SET SCHEMA %I', t, current_schema());
        END IF;
    END LOOP;
END $$;
