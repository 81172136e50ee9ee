//! Accounts as the browser sees them: the signed-in user, users (the Users page), API tokens
//! (the Account page).

use serde::{Deserialize, Serialize};

/// What a user may do; each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleView {
    /// Reads everything.
    Viewer,
    /// Also releases, marks succeeded, requeues, drills.
    Operator,
    /// Also manages cleanup schedules, users and settings.
    Admin,
}

impl RoleView {
    /// Every role, least to most.
    pub const ALL: [RoleView; 3] = [RoleView::Viewer, RoleView::Operator, RoleView::Admin];

    /// The wire name (`viewer`, `operator`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            RoleView::Viewer => "viewer",
            RoleView::Operator => "operator",
            RoleView::Admin => "admin",
        }
    }

    /// Parses a wire name.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == value)
    }
}

/// The signed-in user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrentUser {
    /// User id.
    pub id: i64,
    /// Login name.
    pub name: String,
    /// Role.
    pub role: RoleView,
}

impl CurrentUser {
    /// May act on records (release, mark succeeded, requeue, drill).
    pub fn can_operate(&self) -> bool {
        self.role >= RoleView::Operator
    }

    /// May manage users, cleanup schedules and settings.
    pub fn is_admin(&self) -> bool {
        self.role == RoleView::Admin
    }
}

/// A user on the Users page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    /// User id.
    pub id: i64,
    /// Login name.
    pub name: String,
    /// Role.
    pub role: RoleView,
    /// Disabled users cannot sign in or use tokens.
    pub disabled: bool,
    /// Created, RFC 3339.
    pub created_at: String,
    /// Last sign-in, RFC 3339.
    pub last_login_at: Option<String>,
}

/// An API token as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    /// Token id.
    pub id: i64,
    /// What its owner calls it.
    pub name: String,
    /// Its first characters.
    pub prefix: String,
    /// Created, RFC 3339.
    pub created_at: String,
    /// Last used, RFC 3339.
    pub last_used_at: Option<String>,
    /// Revoked, RFC 3339.
    pub revoked_at: Option<String>,
}

/// A token just created: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTokenView {
    /// The token.
    pub token: TokenView,
    /// The secret to send as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// The session as the page sees it: the signed-in user (none when signed out), the CSRF token
/// the sign-out form posts, and what the console allows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The signed-in user.
    pub user: Option<CurrentUser>,
    /// The session's CSRF token (none for API-token requests and signed-out visitors).
    pub csrf_token: Option<String>,
    /// The console is read-only: every change is refused, so no action button is shown.
    pub read_only: bool,
    /// The user signed in with the console's own accounts (API tokens are theirs); false when
    /// the host application signs users in.
    pub accounts: bool,
    /// Where "Sign out" goes: the console's `/logout` (a form post), or the host's sign-out page
    /// (a link); none: no sign-out here.
    pub sign_out: Option<SignOutView>,
}

/// How the user signs out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SignOutView {
    /// A form post to the console's `/logout` with the CSRF token.
    Console,
    /// A link to the host's sign-out page.
    Host(String),
}
