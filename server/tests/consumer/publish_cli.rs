//! `dedup-console publish` refuses a message id the consumer could not read, before sending
//! anything: an empty one, and one too long for the AMQP property when the group's `ids.from`
//! does not read the header it would travel in.

use crate::support::World;

#[tokio::test]
async fn publish_refuses_ids_the_consumer_could_not_read() {
    let world = World::new().await;
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = world.command(args);
        cmd.envs(env.iter().copied());
        async move { cmd.output().await.expect("dedup-console runs") }
    };
    let empty = run(&["publish", "--message-id", "", "{}"], &[]).await;
    let stderr = String::from_utf8_lossy(&empty.stderr).into_owned();
    assert!(!empty.status.success() && stderr.contains("--message-id"), "{stderr}");

    let long = "L".repeat(300);
    let property_only = [("DEDUP_CONSUMER__IDS__FROM", r#"["property"]"#)];
    let refused = run(&["publish", "--message-id", &long, "--routing-key", "order.pay", "{}"], &property_only).await;
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success() && stderr.contains("x-message-id header"), "{stderr}");

    // With the default ids.from (which reads x-message-id) it goes.
    let sent = run(&["publish", "--message-id", &long, "--routing-key", "order.pay", "{}"], &[]).await;
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
}
