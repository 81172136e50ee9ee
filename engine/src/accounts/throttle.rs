//! Login throttling: failed sign-ins counted per key (`account:<lower name>`,
//! `address:<client ip>`) in the `login_failures` table (kept by
//! [`super::books::AccountBooks`]), so every server instance sees the same
//! counts. A key with `limit` failures inside its window is refused until the window ends;
//! a successful sign-in clears its account key.

use super::users::UserName;

/// The throttle key of an account name: its first 65 characters, trimmed and in lower case (no
/// account has a longer name, so every longer one may share a key, and a name of any length
/// makes a key every database stores).
pub fn account_key(name: &str) -> String {
    let name: String = name.trim().chars().take(UserName::MAX_CHARS + 1).collect();
    format!("account:{}", name.to_lowercase())
}

/// The throttle key of a client address.
pub fn address_key(address: &str) -> String {
    format!("address:{address}")
}
