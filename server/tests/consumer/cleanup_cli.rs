//! `dedup-console cleanup` as an operator runs it: schedules created, listed, edited and run from
//! the command line, an invalid one refused with the reason, every change audited as `cli:…`.

use std::process::Output;

use crate::support::World;

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn cleanup_schedules_are_created_listed_edited_and_run_from_the_command_line() {
    let world = World::new().await;
    let cli = |args: &[&str]| {
        let mut cmd = world.command(args);
        cmd.env("USER", "olga");
        async move { cmd.output().await.expect("dedup-console runs") }
    };

    let out = cli(&["cleanup", "create", "--name", "nightly", "--retention-days", "7"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.starts_with("schedule ") && stdout.contains("created; next run: "), "{stdout}");
    let id: i64 = sqlx::query_scalar("SELECT id FROM cleanup_schedules WHERE name = 'nightly'")
        .fetch_one(&world.db.pool)
        .await
        .unwrap();

    // Refused with the reason, nothing stored: a four-field cron expression, a name taken.
    let out = cli(&["cleanup", "create", "--name", "broken", "--cron", "0 3 * *"]).await;
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("invalid cron expression") && stderr.contains("it has 4 fields"), "{stderr}");
    let out = cli(&["cleanup", "create", "--name", "nightly"]).await;
    assert!(!out.status.success());
    assert!(text(&out).1.contains("exists already"), "{}", text(&out).1);

    let out = cli(&["cleanup", "list"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let row = stdout.lines().find(|l| l.contains("nightly")).unwrap_or_else(|| panic!("listed: {stdout}"));
    assert!(row.contains("0 3 * * *") && row.contains("7 d") && row.contains("succeeded"), "{row}");
    assert!(!stdout.contains("broken"), "the refused one was not stored: {stdout}");

    // An edit changes what it names and keeps the rest.
    let id_text = id.to_string();
    let edit = [
        "cleanup",
        "edit",
        &id_text,
        "--retention-days",
        "14",
        "--status",
        "succeeded",
        "--status",
        "dead",
        "--disable",
        "--fingerprint-days",
        "3",
    ];
    let out = cli(&edit).await;
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).0.contains("next run: disabled"), "{}", text(&out).0);
    let (cron, retention, statuses, enabled, fingerprint_days): (String, i32, Vec<String>, bool, Option<i32>) =
        sqlx::query_as(
            "SELECT cron, retention_days, statuses, enabled, fingerprint_days FROM cleanup_schedules WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    assert_eq!(
        (cron.as_str(), retention, statuses, enabled, fingerprint_days),
        ("0 3 * * *", 14, vec!["dead".to_owned(), "succeeded".to_owned()], false, Some(3))
    );
    let listed = text(&cli(&["cleanup", "list"]).await).0;
    let row = listed.lines().find(|l| l.contains("nightly")).unwrap_or_default().to_owned();
    assert!(row.contains("14 d") && row.contains("3 d"), "the fingerprint horizon listed: {listed}");

    // Run: one record past the retention, one inside it.
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, source_broker, first_seen_at, completed_at)
         VALUES ('order-service', 'ORDER.PAY.OLD:1', 'ORDER.PAY', 'succeeded', 1, 5, '\\x00', 'rabbitmq',
                 now() - interval '20 days', now() - interval '20 days'),
                ('order-service', 'ORDER.PAY.NEW:1', 'ORDER.PAY', 'succeeded', 1, 5, '\\x00', 'rabbitmq', now(), now())",
    )
    .execute(&world.db.pool)
    .await
    .unwrap();
    let out = cli(&["cleanup", "run", &id_text, "--dry-run"]).await;
    assert_eq!(text(&out).0.trim(), "1 records would be deleted", "{}", text(&out).1);
    // The short form of `cleanup run`.
    let out = cli(&["cleanup", &id_text]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).0.contains(": 1 records deleted"), "{}", text(&out).0);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM dedup_records").fetch_all(&world.db.pool).await.unwrap();
    assert_eq!(left, ["ORDER.PAY.NEW:1"]);
    let (kept, days): (i64, f64) = sqlx::query_as(
        "SELECT count(*), COALESCE(max(extract(epoch FROM forget_at - now()) / 86400), 0)::float8 FROM dedup_fingerprints",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert!(kept == 1 && days > 2.0 && days <= 3.0, "its fingerprint kept 3 days: {kept} {days}");
    let out = cli(&["cleanup", "edit", &id_text, "--default-fingerprint-days"]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    let days: Option<i32> = sqlx::query_scalar("SELECT fingerprint_days FROM cleanup_schedules WHERE id = $1")
        .bind(id)
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    assert_eq!(days, None, "10 × the retention again");

    let audited: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, outcome FROM audit_log WHERE actor = 'cli:olga' AND action LIKE 'cleanup.%' ORDER BY id",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    let pairs: Vec<(&str, &str)> = audited.iter().map(|(a, o)| (a.as_str(), o.as_str())).collect();
    assert_eq!(
        pairs,
        [
            ("cleanup.schedule.create", "ok"),
            ("cleanup.schedule.create", "refused"),
            ("cleanup.schedule.create", "refused"),
            ("cleanup.schedule.update", "ok"),
            ("cleanup.run", "ok"),
            ("cleanup.schedule.update", "ok"),
        ],
        "every change and refusal audited as the CLI's user"
    );
}
