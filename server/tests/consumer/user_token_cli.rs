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
