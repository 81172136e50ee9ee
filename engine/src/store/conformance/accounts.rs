//! Conformance cases of the accounts ([`crate::accounts::AccountBooks`]): users unique ignoring
//! case, the last-admin guard, API tokens, the login throttle.

use std::time::Duration;

use super::Harness;
use crate::accounts::passwords::{hash_password, verify_password};
use crate::accounts::books::MAX_THROTTLE_WINDOW;
use crate::accounts::throttle::{account_key, address_key};
use crate::accounts::tokens::{token_authenticate, token_create};
use crate::accounts::users::UserChange;
use crate::accounts::{AccountError, Role, UserName};
use crate::console::console_store;

fn name(n: &str) -> UserName {
    UserName::parse(n).unwrap()
}

/// Names are unique ignoring case and found ignoring case, never by a trailing space or another
/// accent; a password is replaced.
pub async fn users_are_unique_ignoring_case_and_passwords_change<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let books = console_store(&pool);
    let hash = hash_password("first password!").unwrap();
    let alice = books.user_add(&name("Alice"), Role::Operator, &hash).await.unwrap();
    let err = books.user_add(&name("alice"), Role::Viewer, &hash).await.unwrap_err();
    assert!(matches!(err, AccountError::NameTaken(_)), "{err}");

    let changed = books.user_set_password("ALICE", &hash_password("second password!").unwrap()).await.unwrap();
    assert_eq!(changed.id, alice.id);
    let (user, stored) = books.user_credentials("alice").await.unwrap().expect("found ignoring case");
    assert_eq!(user, alice);
    assert!(verify_password("second password!", Some(&stored)));
    for other in ["nobody", "alice ", "\u{e1}lice", "al\u{130}ce", "AL\u{130}CE", &"a".repeat(10_000)] {
        assert!(books.user_credentials(other).await.unwrap().is_none(), "{other:?}");
    }
    assert!(matches!(books.user_set_password("nobody", &stored).await, Err(AccountError::NotFound(_))));

    books.user_add(&name("bob"), Role::Viewer, &hash).await.unwrap();
    let names: Vec<String> = books.user_list().await.unwrap().into_iter().map(|u| u.name).collect();
    assert_eq!(names, ["Alice", "bob"], "by name ignoring case");
    books.user_touch_login(alice.id).await.unwrap();
    let signed_in = books.user_by_id(alice.id).await.unwrap().unwrap();
    assert!(signed_in.last_login_at.is_some_and(|t| t >= signed_in.created_at));
    assert!(books.user_by_id(-1).await.unwrap().is_none());
}

/// The last enabled admin can be neither demoted nor disabled, and of two admins demoted at
/// once, exactly one is.
pub async fn the_last_enabled_admin_cannot_be_demoted_or_disabled_even_by_two_at_once<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let books = console_store(&pool);
    let hash = hash_password("admin password").unwrap();
    let root = books.user_add(&name("root"), Role::Admin, &hash).await.unwrap();
    let demote = UserChange { role: Some(Role::Viewer), disabled: None };
    assert!(matches!(books.user_update(root.id, demote).await, Err(AccountError::LastAdmin)));
    let disable = UserChange { role: None, disabled: Some(true) };
    assert!(matches!(books.user_update(root.id, disable).await, Err(AccountError::LastAdmin)));
    assert_eq!(books.user_list().await.unwrap()[0].role, Role::Admin, "nothing changed");
    assert!(matches!(books.user_update(-1, demote).await, Err(AccountError::NotFound(_))));

    let second = books.user_add(&name("second"), Role::Admin, &hash).await.unwrap();
    let (a, b) = tokio::join!(books.user_update(root.id, demote), books.user_update(second.id, disable));
    assert!(a.is_ok() != b.is_ok(), "exactly one of two concurrent demotions: {a:?} {b:?}");
    let refused = if a.is_ok() { b } else { a };
    assert!(matches!(refused, Err(AccountError::LastAdmin)), "{refused:?}");
    let admins = books.user_list().await.unwrap().into_iter().filter(|u| u.role == Role::Admin && !u.disabled).count();
    assert_eq!(admins, 1);
}

/// A token authenticates its enabled owner until it is revoked; only its SHA-256 is stored.
pub async fn tokens_authenticate_until_revoked_or_the_owner_is_disabled<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let books = console_store(&pool);
    let hash = hash_password("bot password!").unwrap();
    let bot = books.user_add(&name("bot"), Role::Viewer, &hash).await.unwrap();
    let (token, secret) = token_create(books, bot.id, "ci \u{1F916} pipeline").await.unwrap();
    assert!(secret.starts_with("dct_") && secret.starts_with(&token.prefix));
    assert_eq!(token.name, "ci \u{1F916} pipeline");
    let stored = h.token_digests().await;
    assert!(stored.len() == 1 && stored[0].len() == 32, "only the SHA-256 is stored");
    assert_eq!(token_authenticate(books, &secret).await.unwrap().map(|u| u.id), Some(bot.id));
    assert!(books.token_list(bot.id).await.unwrap()[0].last_used_at.is_some(), "its use is noted");
    assert!(token_authenticate(books, "dct_guess").await.unwrap().is_none());

    let other = books.user_add(&name("other"), Role::Admin, &hash).await.unwrap();
    assert!(matches!(books.token_revoke(other.id, token.id).await, Err(AccountError::NotFound(_))));
    books.user_update(bot.id, UserChange { role: None, disabled: Some(true) }).await.unwrap();
    assert!(token_authenticate(books, &secret).await.unwrap().is_none(), "disabled owner");
    books.user_update(bot.id, UserChange { role: None, disabled: Some(false) }).await.unwrap();
    let revoked = books.token_revoke(bot.id, token.id).await.unwrap();
    let at = revoked.revoked_at.expect("revoked");
    assert_eq!(books.token_revoke(bot.id, token.id).await.unwrap().revoked_at, Some(at), "revoked once");
    assert!(token_authenticate(books, &secret).await.unwrap().is_none(), "revoked");
    let (second, _) = token_create(books, bot.id, "second").await.unwrap();
    let listed: Vec<i64> = books.token_list(bot.id).await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(listed, [second.id, token.id], "newest first, revoked ones included");
    for bad in [" ", "line\nbreak", &"x".repeat(65)] {
        assert!(matches!(token_create(books, bot.id, bad).await, Err(AccountError::Invalid(_))), "{bad:?}");
    }
}

/// A key with its limit of failures in its window is refused until it is cleared or the window
/// ends; a name of any length makes a key; a window longer than a year is a year.
pub async fn the_throttle_refuses_after_the_limit_until_cleared_or_the_window_ends<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let books = console_store(&pool);
    let window = Duration::from_secs(60);
    let limits = [(account_key("Alice"), 3), (address_key("10.0.0.1"), 10)];
    let keys: Vec<String> = limits.iter().map(|(k, _)| k.clone()).collect();
    for _ in 0..3 {
        assert_eq!(books.throttle_check(&limits, window).await.unwrap(), None);
        books.throttle_fail(&keys, window).await.unwrap();
    }
    let wait = books.throttle_check(&limits, window).await.unwrap().expect("throttled");
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(books.throttle_check(&limits[1..], window).await.unwrap(), None, "the address is under its limit");
    books.throttle_clear(&account_key("alice")).await.unwrap();
    assert_eq!(books.throttle_check(&limits, window).await.unwrap(), None);
    // A window that has passed starts over.
    let short = Duration::from_millis(1);
    for _ in 0..3 {
        books.throttle_fail(&keys[..1], short).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(books.throttle_check(&limits, short).await.unwrap(), None);
    // A hostile name of 10 000 characters is throttled like any other.
    let long = [(account_key(&"\u{e9}".repeat(10_000)), 1)];
    books.throttle_fail(&[long[0].0.clone()], window).await.unwrap();
    assert!(books.throttle_check(&long, window).await.unwrap().is_some());
    // A window of u64::MAX seconds is a year's: the throttle still refuses.
    let forever = Duration::from_secs(u64::MAX);
    let bob = [(account_key("bob"), 1)];
    books.throttle_fail(&[bob[0].0.clone()], forever).await.unwrap();
    let wait = books.throttle_check(&bob, forever).await.unwrap().expect("throttled for a year");
    assert!(wait > MAX_THROTTLE_WINDOW.as_secs() - 60 && wait <= MAX_THROTTLE_WINDOW.as_secs(), "{wait}");
}
