//! Who a client is: configured tokens (`[[gateway.tokens]]`) stand for principals with scopes.
//!
//! A session created through a principal belongs to it; memory applies the ownership rule in
//! SQL, from the [`Caller`] each session call carries. An admin sees every session.

use std::fmt;

use agentloop_proto::v1::Caller;

use crate::RequestError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `chat.history`, `sessions.list`, `agent.wait`.
    Read,
    /// `agent`, `chat.send`, `chat.abort`, `sessions.reset`, `sessions.patch`, `/v1` completions.
    Write,
    /// Everything, on every session, and any model.
    Admin,
}

/// A token's secret; `Debug` never shows it, so configs and errors can be logged.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Returns the secret itself, for comparing and sending only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A configured token: its secret, the principal it stands for and its scopes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenGrant {
    /// The secret clients present.
    pub token: Secret,
    /// The principal; `None` only for the plain list form, which means an admin.
    #[serde(default)]
    pub principal: Option<String>,
    /// What the token may do.
    pub scopes: Vec<Scope>,
}

impl TokenGrant {
    /// Returns an admin token without principal, what a plain list entry means.
    pub fn admin(token: impl Into<String>) -> Self {
        Self {
            token: Secret(token.into()),
            principal: None,
            scopes: vec![Scope::Admin],
        }
    }

    /// Returns why this grant cannot be served, if it cannot: a non-admin without principal
    /// would see every session that has no owner, and one without scopes could do nothing.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        let admin = self.scopes.contains(&Scope::Admin);
        if self.scopes.is_empty() {
            return Some("a token needs at least one scope (read, write, admin)");
        }
        match self.principal.as_deref() {
            Some(name) if name.trim().is_empty() => Some("a principal must not be empty"),
            None if !admin => Some("a token without admin scope needs a principal"),
            _ => None,
        }
    }
}

impl From<&str> for TokenGrant {
    fn from(token: &str) -> Self {
        Self::admin(token)
    }
}

impl From<String> for TokenGrant {
    fn from(token: String) -> Self {
        Self::admin(token)
    }
}

/// An authenticated client: whom it acts for and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    name: Option<String>,
    scopes: Vec<Scope>,
}

impl Principal {
    /// A loopback client of a gateway without tokens: today's trusted local user.
    pub(crate) fn local_admin() -> Self {
        Self {
            name: None,
            scopes: vec![Scope::Admin],
        }
    }

    /// The principal a token grants.
    pub(crate) fn of(grant: &TokenGrant) -> Self {
        Self {
            name: grant.principal.clone(),
            scopes: grant.scopes.clone(),
        }
    }

    /// Returns the principal it acts for; `None` for an admin token without one.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Returns whether it sees and may change every session.
    pub(crate) fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// Checks that it holds `scope` (admin holds all).
    ///
    /// # Errors
    /// [`RequestError::Forbidden`] naming the missing scope.
    pub(crate) fn require(&self, scope: Scope) -> Result<(), RequestError> {
        if self.is_admin() || self.scopes.contains(&scope) {
            return Ok(());
        }
        Err(RequestError::Forbidden(format!(
            "this token lacks the {} scope",
            match scope {
                Scope::Read => "read",
                Scope::Write => "write",
                Scope::Admin => "admin",
            }
        )))
    }

    /// Returns it as memory's session calls take it.
    pub(crate) fn caller(&self) -> Caller {
        Caller {
            principal: self.name.clone().unwrap_or_default(),
            admin: self.is_admin(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_grant_what_they_name_and_admin_grants_all() {
        let reader = Principal::of(&TokenGrant {
            token: Secret("t".into()),
            principal: Some("carol".into()),
            scopes: vec![Scope::Read],
        });
        assert!(reader.require(Scope::Read).is_ok());
        assert_eq!(
            reader.require(Scope::Write).map_err(|e| e.code()),
            Err("FORBIDDEN")
        );
        assert_eq!(
            reader.caller(),
            Caller {
                principal: "carol".into(),
                admin: false
            }
        );
        let admin = Principal::local_admin();
        assert!(admin.require(Scope::Write).is_ok() && admin.caller().admin);
    }

    #[test]
    fn a_secret_never_shows_in_debug() {
        let grant = TokenGrant::admin("hunter2");
        assert!(!format!("{grant:?}").contains("hunter2"));
    }

    #[test]
    fn grants_without_principal_or_scopes_are_refused_unless_admin() {
        let mut grant = TokenGrant::admin("t");
        assert_eq!(grant.problem(), None);
        grant.scopes = vec![Scope::Write];
        assert!(grant.problem().is_some());
        grant.principal = Some(" ".into());
        assert!(grant.problem().is_some());
        grant.principal = Some("alice".into());
        assert_eq!(grant.problem(), None);
        grant.scopes.clear();
        assert!(grant.problem().is_some());
    }
}
