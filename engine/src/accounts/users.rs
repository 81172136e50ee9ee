//! Users: names, roles, enabled or disabled (kept with their password hashes by
//! [`super::books::AccountBooks`]).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::AccountError;

/// What a user may do. Ordered: each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page and API resource.
    Viewer,
    /// Also acts on records: release, mark succeeded, requeue, drill.
    Operator,
    /// Also manages cleanup schedules, users and settings.
    Admin,
}

impl Role {
    /// Every role, least to most.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// The stored (and wire) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AccountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| AccountError::Invalid(format!("unknown role {s:?}: use viewer, operator or admin")))
    }
}

/// A validated user name: 1 to 64 ASCII letters, digits, `.`, `_`, `-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserName(String);

impl UserName {
    /// Longest user name.
    pub(crate) const MAX_CHARS: usize = 64;

    /// Parses a user name (surrounding spaces trimmed).
    ///
    /// # Errors
    /// [`AccountError::Invalid`] naming the rule broken.
    pub fn parse(value: &str) -> Result<Self, AccountError> {
        let value = value.trim();
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if value.is_empty() || value.len() > Self::MAX_CHARS || !value.chars().all(ok_char) {
            return Err(AccountError::Invalid(format!(
                "a user name has 1 to {} letters, digits, '.', '_' or '-'",
                Self::MAX_CHARS
            )));
        }
        Ok(UserName(value.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A user, without the password hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    /// Row id.
    pub id: i64,
    /// Login name.
    pub name: String,
    /// What the user may do.
    pub role: Role,
    /// A disabled user can neither sign in nor use API tokens; existing sessions stop working.
    pub disabled: bool,
    /// When the account was created.
    pub created_at: DateTime<Utc>,
    /// Last successful sign-in.
    pub last_login_at: Option<DateTime<Utc>>,
}

impl User {
    /// The audit log's actor string, `user:<name>`.
    pub fn actor(&self) -> String {
        format!("user:{}", self.name)
    }
}

/// What [`AccountBooks::user_update`](super::books::AccountBooks::user_update) changes; `None` keeps the current value.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserChange {
    /// The new role.
    pub role: Option<Role>,
    /// Disable (`true`) or enable (`false`).
    pub disabled: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_roles_parse_with_clear_errors() {
        assert_eq!(UserName::parse(" alice.b-2 ").unwrap().as_str(), "alice.b-2");
        for bad in ["", "a b", "<script>", &"x".repeat(65)] {
            assert!(UserName::parse(bad).unwrap_err().to_string().contains("1 to 64"), "{bad}");
        }
        assert_eq!("operator".parse::<Role>().unwrap(), Role::Operator);
        assert!("root".parse::<Role>().unwrap_err().to_string().contains("viewer, operator or admin"));
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }
}
