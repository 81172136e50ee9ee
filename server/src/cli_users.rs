//! `dedup-console user add|set-password|list|token|tokens|revoke-token`: account management from the command line,
//! for the first admin, for recovery, and for API tokens of scripts and CI. Passwords come from the `DEDUP_USER_PASSWORD` environment
//! variable or the first line of standard input, never from an argument (arguments are visible
//! in `ps` and shell history). Changes are in the audit log with actor `cli:<os user>`.

use std::io::BufRead;

use anyhow::Context;
use clap::{Args, Subcommand};
use dedup_engine::EnginePool;
use dedup_engine::console::accounts::passwords::{self, hash_password};
use dedup_engine::console::accounts::tokens::token_create;
use dedup_engine::console::accounts::{AccountBooks, Role, User, UserName};
use dedup_engine::console::audit::{AuditOutcome, NewAuditEntry};
use dedup_engine::console::console_store;
use serde_json::json;

/// The environment variable a password may come from.
pub const PASSWORD_ENV: &str = "DEDUP_USER_PASSWORD";

/// `user` subcommands.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user. Password from DEDUP_USER_PASSWORD or the first line of stdin.
    Add(UserAddArgs),
    /// Set a user's password. Password from DEDUP_USER_PASSWORD or the first line of stdin.
    SetPassword(UserNameArg),
    /// List users with role and state.
    List,
    /// Create an API token for a user and print it on stdout, alone (it is shown once; only its
    /// SHA-256 is stored): `TOKEN=$(dedup-console user token ci --label pipeline)`.
    Token(UserTokenArgs),
    /// List a user's API tokens: id, label, first characters, created, last used, revoked.
    Tokens(UserNameArg),
    /// Revoke one of a user's API tokens by its id (as `user tokens` lists it).
    RevokeToken(UserRevokeArgs),
}

/// `user revoke-token` options.
#[derive(Debug, Args)]
pub struct UserRevokeArgs {
    /// Login name of the token's owner.
    pub name: String,
    /// The token's id.
    pub id: i64,
}

/// `user token` options.
#[derive(Debug, Args)]
pub struct UserTokenArgs {
    /// Login name of the token's owner (the token acts with that user's role).
    pub name: String,
    /// What the token is for, as the Account page lists it.
    #[arg(long, default_value = "cli")]
    pub label: String,
}

/// `user add` options.
#[derive(Debug, Args)]
pub struct UserAddArgs {
    /// Login name (letters, digits, '.', '_', '-').
    pub name: String,
    /// viewer (read), operator (also act on records) or admin (also users, cleanup, settings).
    #[arg(long, default_value = "viewer")]
    pub role: String,
}

/// A user name argument.
#[derive(Debug, Args)]
pub struct UserNameArg {
    /// Login name.
    pub name: String,
}

/// The audit actor of this command: `cli:<os user>`.
fn actor() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".to_owned());
    format!("cli:{user}")
}

fn read_password() -> anyhow::Result<String> {
    if let Ok(password) = std::env::var(PASSWORD_ENV) {
        return Ok(password);
    }
    eprintln!("password (one line on stdin; or set {PASSWORD_ENV}):");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the password from stdin")?;
    Ok(line.trim_end_matches(['\n', '\r']).to_owned())
}

async fn audit(db: &EnginePool, action: &str, detail: serde_json::Value) -> anyhow::Result<()> {
    let entry = NewAuditEntry {
        actor: &actor(),
        action,
        outcome: AuditOutcome::Ok,
        reason: None,
        consumer_group: None,
        message_ids: &[],
        detail,
        source: Some("cli"),
    };
    console_store(db).record(&entry).await.context("writing the audit log")?;
    Ok(())
}

/// Runs a `user` subcommand against the engine's database `db`.
///
/// # Errors
/// Invalid name, role or password, a taken name, an unknown user, or a database error.
pub async fn run(db: &EnginePool, command: UserCommand) -> anyhow::Result<()> {
    let accounts = console_store(db);
    match command {
        UserCommand::Add(args) => {
            let name = UserName::parse(&args.name)?;
            let role: Role = args.role.parse()?;
            let password = read_password()?;
            let hash = passwords::blocking(move || hash_password(&password)).await??;
            let user = accounts.user_add(&name, role, &hash).await?;
            audit(db, "user.add", json!({ "user": user.name, "role": role.as_str() })).await?;
            println!("added user {} ({})", user.name, user.role);
        }
        UserCommand::SetPassword(args) => {
            let password = read_password()?;
            let hash = passwords::blocking(move || hash_password(&password)).await??;
            let user = accounts.user_set_password(&args.name, &hash).await?;
            audit(db, "user.set_password", json!({ "user": user.name })).await?;
            println!("password of {} changed", user.name);
        }
        UserCommand::Token(args) => {
            let user = named_user(accounts, &args.name).await?;
            if user.disabled {
                // Its token would not authenticate, and would start to the day the user is
                // enabled again, unnoticed.
                anyhow::bail!("user {} is disabled: enable them before making them a token", user.name);
            }
            let (token, secret) = token_create(accounts, user.id, &args.label).await?;
            let detail = json!({ "user": user.name, "name": token.name, "token_id": token.id });
            audit(db, "token.create", detail).await?;
            println!("{secret}");
        }
        UserCommand::Tokens(args) => {
            let user = named_user(accounts, &args.name).await?;
            let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339());
            println!("{:<8} {:<24} {:<12} {:<26} {:<26} revoked", "id", "label", "starts", "created", "last used");
            for t in accounts.token_list(user.id).await? {
                let created = t.created_at.to_rfc3339();
                let (used, revoked) = (time(t.last_used_at), time(t.revoked_at));
                println!("{:<8} {:<24} {:<12} {created:<26} {used:<26} {revoked}", t.id, t.name, t.prefix);
            }
        }
        UserCommand::RevokeToken(args) => {
            let user = named_user(accounts, &args.name).await?;
            let token = accounts.token_revoke(user.id, args.id).await?;
            audit(db, "token.revoke", json!({ "user": user.name, "token_id": token.id })).await?;
            println!("token {} ({}) of {} revoked", token.id, token.name, user.name);
        }
        UserCommand::List => {
            for u in accounts.user_list().await? {
                let state = if u.disabled { "disabled" } else { "enabled" };
                let last = u.last_login_at.map_or_else(|| "never".to_owned(), |t| t.to_rfc3339());
                println!("{:<24} {:<9} {:<9} last sign-in {last}", u.name, u.role, state);
            }
        }
    }
    Ok(())
}

/// The user named `name`, matched as sign-in and `set-password` match names: trimmed, any case.
async fn named_user(accounts: &dyn AccountBooks, name: &str) -> anyhow::Result<User> {
    let name = name.trim();
    accounts
        .user_list()
        .await?
        .into_iter()
        .find(|u| u.name.as_str().eq_ignore_ascii_case(name))
        .with_context(|| format!("no user named {name:?} (see `user list`)"))
}
