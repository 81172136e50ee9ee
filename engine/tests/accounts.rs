//! Accounts against a real PostgreSQL: users, the last-admin guard, API tokens, the throttle.

use std::time::Duration;

use dedup_engine::accounts::passwords::{hash_password, verify_password};
use dedup_engine::accounts::throttle::{account_key, address_key, throttle_check, throttle_clear, throttle_fail};
use dedup_engine::accounts::tokens::{token_authenticate, token_create, token_list, token_revoke};
use dedup_engine::accounts::users::{
    UserChange, user_add, user_credentials, user_list, user_set_password, user_update,
};
use dedup_engine::accounts::{AccountError, Role, UserName};
use dedup_engine::testing::TestDatabase;

#[tokio::test]
async fn users_are_unique_ignoring_case_and_passwords_change() {
    let db = TestDatabase::create().await;
    let hash = hash_password("first password!").unwrap();
    let alice = user_add(&db.pool, &UserName::parse("Alice").unwrap(), Role::Operator, &hash).await.unwrap();
    let err = user_add(&db.pool, &UserName::parse("alice").unwrap(), Role::Viewer, &hash).await.unwrap_err();
    assert!(matches!(err, AccountError::NameTaken(_)), "{err}");

    user_set_password(&db.pool, "ALICE", &hash_password("second password!").unwrap()).await.unwrap();
    let (user, stored) = user_credentials(&db.pool, "alice").await.unwrap().expect("found ignoring case");
    assert_eq!(user, alice);
    assert!(verify_password("second password!", Some(&stored)));
    assert!(user_credentials(&db.pool, "nobody").await.unwrap().is_none());
    assert!(matches!(user_set_password(&db.pool, "nobody", &stored).await, Err(AccountError::NotFound(_))));
}

#[tokio::test]
async fn the_last_enabled_admin_cannot_be_demoted_or_disabled() {
    let db = TestDatabase::create().await;
    let hash = hash_password("admin password").unwrap();
    let root = user_add(&db.pool, &UserName::parse("root").unwrap(), Role::Admin, &hash).await.unwrap();
    let demote = UserChange { role: Some(Role::Viewer), disabled: None };
    assert!(matches!(user_update(&db.pool, root.id, demote).await, Err(AccountError::LastAdmin)));
    let disable = UserChange { role: None, disabled: Some(true) };
    assert!(matches!(user_update(&db.pool, root.id, disable).await, Err(AccountError::LastAdmin)));
    assert_eq!(user_list(&db.pool).await.unwrap()[0].role, Role::Admin, "nothing changed");

    let second = user_add(&db.pool, &UserName::parse("second").unwrap(), Role::Admin, &hash).await.unwrap();
    let demoted = user_update(&db.pool, root.id, demote).await.unwrap();
    assert_eq!(demoted.role, Role::Viewer);
    assert!(matches!(user_update(&db.pool, second.id, disable).await, Err(AccountError::LastAdmin)));
}

#[tokio::test]
async fn tokens_authenticate_until_revoked_or_the_owner_is_disabled() {
    let db = TestDatabase::create().await;
    let hash = hash_password("bot password!").unwrap();
    let bot = user_add(&db.pool, &UserName::parse("bot").unwrap(), Role::Viewer, &hash).await.unwrap();
    let (token, secret) = token_create(&db.pool, bot.id, "ci").await.unwrap();
    assert!(secret.starts_with("dct_") && secret.starts_with(&token.prefix));
    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_sha256 FROM api_tokens").fetch_one(&db.pool).await.unwrap();
    assert_eq!(stored.len(), 32, "only the SHA-256 is stored");
    assert_eq!(token_authenticate(&db.pool, &secret).await.unwrap().map(|u| u.id), Some(bot.id));
    assert!(token_authenticate(&db.pool, "dct_guess").await.unwrap().is_none());

    let other = user_add(&db.pool, &UserName::parse("other").unwrap(), Role::Admin, &hash).await.unwrap();
    assert!(matches!(token_revoke(&db.pool, other.id, token.id).await, Err(AccountError::NotFound(_))));
    user_update(&db.pool, bot.id, UserChange { role: None, disabled: Some(true) }).await.unwrap();
    assert!(token_authenticate(&db.pool, &secret).await.unwrap().is_none(), "disabled owner");
    user_update(&db.pool, bot.id, UserChange { role: None, disabled: Some(false) }).await.unwrap();
    let revoked = token_revoke(&db.pool, bot.id, token.id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    assert!(token_authenticate(&db.pool, &secret).await.unwrap().is_none(), "revoked");
    assert_eq!(token_list(&db.pool, bot.id).await.unwrap().len(), 1);
    assert!(token_create(&db.pool, bot.id, " ").await.is_err());
}

#[tokio::test]
async fn the_throttle_refuses_after_the_limit_until_cleared_or_the_window_ends() {
    let db = TestDatabase::create().await;
    let window = Duration::from_secs(60);
    let limits = [(account_key("Alice"), 3), (address_key("10.0.0.1"), 10)];
    let keys: Vec<String> = limits.iter().map(|(k, _)| k.clone()).collect();
    for _ in 0..3 {
        assert_eq!(throttle_check(&db.pool, &limits, window).await.unwrap(), None);
        throttle_fail(&db.pool, &keys, window).await.unwrap();
    }
    let wait = throttle_check(&db.pool, &limits, window).await.unwrap().expect("throttled");
    assert!((1..=60).contains(&wait), "{wait}");
    throttle_clear(&db.pool, &account_key("alice")).await.unwrap();
    assert_eq!(throttle_check(&db.pool, &limits, window).await.unwrap(), None);
    // A window that has passed starts over.
    let short = Duration::from_millis(1);
    for _ in 0..3 {
        throttle_fail(&db.pool, &keys[..1], short).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(throttle_check(&db.pool, &limits, short).await.unwrap(), None);
}
