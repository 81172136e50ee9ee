//! `dedup-console user token NAME`: the name as the rest of the CLI and the sign-in take it
//! (any case), and no token minted for a disabled user (found by a review).

use crate::support::World;

async fn add_user(world: &World, name: &str) {
    let add = world.command(&["user", "add", name]).env("DEDUP_USER_PASSWORD", "a password").output().await.unwrap();
    assert!(add.status.success(), "user add: {}", String::from_utf8_lossy(&add.stderr));
}

#[tokio::test]
async fn user_token_takes_the_name_in_any_case_as_set_password_does() {
    let world = World::new().await;
    add_user(&world, "ci-bot").await;
    let token = world.command(&["user", "token", "CI-Bot"]).output().await.unwrap();
    assert!(token.status.success(), "user token CI-Bot: {}", String::from_utf8_lossy(&token.stderr));
}

#[tokio::test]
async fn user_token_refuses_a_disabled_user() {
    let world = World::new().await;
    add_user(&world, "gone").await;
    sqlx::query("UPDATE users SET disabled = true WHERE name = 'gone'").execute(&world.db.pool).await.unwrap();
    let token = world.command(&["user", "token", "gone"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&token.stderr);
    assert!(
        !token.status.success(),
        "a token that cannot authenticate was printed: {:?}",
        String::from_utf8_lossy(&token.stdout)
    );
    assert!(stderr.contains("disabled"), "{stderr}");
    let tokens: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens").fetch_one(&world.db.pool).await.unwrap();
    assert_eq!(tokens, 0, "no dormant token left for the day the user is enabled again");
}

#[tokio::test]
async fn tokens_are_listed_and_revoked_from_the_command_line() {
    let world = World::new().await;
    add_user(&world, "ci").await;
    let made = world.command(&["user", "token", "ci", "--label", "pipeline"]).output().await.unwrap();
    let secret = String::from_utf8(made.stdout).unwrap().trim().to_owned();
    let list = world.command(&["user", "tokens", "ci"]).output().await.unwrap();
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    let row = listed.lines().find(|l| l.contains("pipeline")).unwrap_or_else(|| panic!("listed: {listed}"));
    assert!(row.contains(&secret[..8]) && !listed.contains(&secret), "its first characters, never the secret: {row}");
    let id = row.split_whitespace().next().unwrap().to_owned();
    let revoke = world.command(&["user", "revoke-token", "ci", &id]).output().await.unwrap();
    assert!(revoke.status.success(), "{}", String::from_utf8_lossy(&revoke.stderr));
    let revoked: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT revoked_at FROM api_tokens WHERE id = $1")
            .bind(id.parse::<i64>().unwrap())
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert!(revoked.is_some());
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'token.revoke'")
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
}
