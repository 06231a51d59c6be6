//! The guard's durable state: the security audit, pairing of direct-message senders and tool
//! approvals. The rules (who is paired, when a code or a request expires, what a grant covers)
//! are SQL functions in `migrations/0019_guard.sql`; these calls only bind and read them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Store, error::translate};
use crate::MemoryError;

/// One security decision, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct AuditRow {
    /// Its place in the audit (0 for one not stored yet).
    pub id: i64,
    /// Which part of the guard decided.
    pub source: String,
    /// What it decided.
    pub decision: String,
    /// The threat level, when one was rated.
    pub level: String,
    /// What the decision was about.
    pub subject: String,
    /// The session, when there is one.
    pub session_id: String,
    /// The run, when there is one.
    pub run_id: String,
    /// Who decided.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When (set by the database).
    pub at: Option<DateTime<Utc>>,
}

/// `CheckSender`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SenderCheck {
    /// allowed | pending | full | refused
    pub outcome: String,
    /// The pending code.
    pub code: String,
    /// Whether this call issued the code.
    pub created: bool,
    /// When the code expires.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A pending pairing code.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PairingCode {
    /// The code.
    pub code: String,
    /// Its channel.
    pub channel: String,
    /// Who asked.
    pub sender_id: String,
    /// Issued at.
    pub created_at: DateTime<Utc>,
    /// Expires at.
    pub expires_at: DateTime<Utc>,
}

/// A paired sender.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PairedSender {
    /// Its channel.
    pub channel: String,
    /// The sender.
    pub sender_id: String,
    /// Paired at.
    pub approved_at: DateTime<Utc>,
    /// By whom.
    pub approved_by: String,
}

/// A tool call waiting for (or answered by) an operator.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ApprovalRow {
    /// Its id.
    pub id: Uuid,
    /// The session of the run.
    pub session_id: Uuid,
    /// The session's key.
    pub session_key: String,
    /// The agent.
    pub agent_id: String,
    /// The run.
    pub run_id: String,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The tool.
    pub tool: String,
    /// The call's arguments (JSON).
    pub arguments: String,
    /// pending | approved | denied | expired
    pub status: String,
    /// Approved for the rest of the session.
    pub always: bool,
    /// Asked at.
    pub created_at: DateTime<Utc>,
    /// Denied as expired after this.
    pub expires_at: DateTime<Utc>,
    /// Who answered.
    pub resolved_by: String,
}

/// What a tool call to be approved is.
#[derive(Clone, Debug)]
pub struct ApprovalAsk<'a> {
    /// The session of the run.
    pub session_id: Uuid,
    /// The session's key.
    pub session_key: &'a str,
    /// The agent.
    pub agent_id: &'a str,
    /// The run.
    pub run_id: &'a str,
    /// The model's id of the call.
    pub tool_call_id: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The call's arguments (JSON).
    pub arguments: &'a str,
    /// How long an operator has, in milliseconds.
    pub timeout_ms: i64,
}

/// The columns of an [`ApprovalRow`], as a literal for `concat!` (sqlx takes only static SQL).
macro_rules! approval_columns {
    () => {
        "id, session_id, session_key, agent_id, run_id, tool_call_id, tool, arguments, status, \
         always, created_at, expires_at, resolved_by"
    };
}

impl Store {
    /// Appends one decision (a repeat of its `dedupe_key` is absorbed).
    ///
    /// # Errors
    /// A database error.
    pub async fn record_audit(&self, row: &AuditRow, dedupe_key: &str) -> Result<(), MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query("SELECT agentloop_audit($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&row.source)
            .bind(&row.decision)
            .bind(&row.level)
            .bind(&row.subject)
            .bind(&row.session_id)
            .bind(&row.run_id)
            .bind(&row.actor)
            .bind(&row.reason)
            .bind(dedupe_key)
            .execute(&mut *conn)
            .await;
        conn.settle(result)
            .map(|_| ())
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// The latest `limit` decisions (of `source` when not empty), newest first.
    ///
    /// # Errors
    /// A database error.
    pub async fn list_audit(&self, limit: u32, source: &str) -> Result<Vec<AuditRow>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, AuditRow>(
            "SELECT id, source, decision, level, subject, session_id, run_id, actor, reason, at \
             FROM security_audit WHERE ($1 = '' OR source = $1) ORDER BY id DESC LIMIT $2",
        )
        .bind(source)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Whether `sender` may write on `channel`, issuing `code` when the channel pairs and the
    /// sender has none (see `agentloop_check_sender`).
    ///
    /// # Errors
    /// A database error.
    pub async fn check_sender(
        &self,
        channel: &str,
        sender: &str,
        may_pair: bool,
        code: &str,
        max_pending: i32,
        ttl_ms: i64,
    ) -> Result<SenderCheck, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, SenderCheck>(
            "SELECT outcome, code, created, expires_at FROM agentloop_check_sender($1, $2, $3, $4, $5, $6)",
        )
        .bind(channel)
        .bind(sender)
        .bind(may_pair)
        .bind(code)
        .bind(max_pending)
        .bind(ttl_ms)
        .fetch_one(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Live pairing codes and paired senders (of `channel` when not empty).
    ///
    /// # Errors
    /// A database error.
    pub async fn list_pairing(
        &self,
        channel: &str,
    ) -> Result<(Vec<PairingCode>, Vec<PairedSender>), MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let pending = sqlx::query_as::<_, PairingCode>(
            "SELECT code, channel, sender_id, created_at, expires_at FROM pairing_requests \
             WHERE ($1 = '' OR channel = $1) AND expires_at > now() ORDER BY created_at",
        )
        .bind(channel)
        .fetch_all(&mut *conn)
        .await;
        let pending = conn
            .settle(pending)
            .map_err(|err| translate(err, Uuid::nil()))?;
        let mut conn = self.conn(Uuid::nil()).await?;
        let paired = sqlx::query_as::<_, PairedSender>(
            "SELECT channel, sender_id, approved_at, approved_by FROM paired_senders \
             WHERE ($1 = '' OR channel = $1) ORDER BY channel, sender_id",
        )
        .bind(channel)
        .fetch_all(&mut *conn)
        .await;
        let paired = conn
            .settle(paired)
            .map_err(|err| translate(err, Uuid::nil()))?;
        Ok((pending, paired))
    }

    /// Pairs the sender of the live `code`; `None` when it is unknown or expired.
    ///
    /// # Errors
    /// A database error.
    pub async fn approve_pairing(
        &self,
        code: &str,
        by: &str,
    ) -> Result<Option<PairedSender>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, PairedSender>(
            "SELECT channel, sender_id, approved_at, $2 AS approved_by FROM agentloop_approve_pairing($1, $2)",
        )
        .bind(code)
        .bind(by)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Unpairs `sender` on `channel`; whether it was paired.
    ///
    /// # Errors
    /// A database error.
    pub async fn revoke_pairing(
        &self,
        channel: &str,
        sender: &str,
        by: &str,
    ) -> Result<bool, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_scalar::<_, bool>("SELECT agentloop_revoke_pairing($1, $2, $3)")
            .bind(channel)
            .bind(sender)
            .bind(by)
            .fetch_one(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Asks for the approval of a call, or finds its request again (a resumed run).
    ///
    /// # Errors
    /// A database error.
    pub async fn request_approval(
        &self,
        ask: &ApprovalAsk<'_>,
    ) -> Result<ApprovalRow, MemoryError> {
        let mut conn = self.conn(ask.session_id).await?;
        let result = sqlx::query_as::<_, ApprovalRow>(concat!(
            "SELECT ",
            approval_columns!(),
            " FROM agentloop_request_approval($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(Uuid::now_v7())
        .bind(ask.session_id)
        .bind(ask.session_key)
        .bind(ask.agent_id)
        .bind(ask.run_id)
        .bind(ask.tool_call_id)
        .bind(ask.tool)
        .bind(ask.arguments)
        .bind(ask.timeout_ms)
        .fetch_one(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, ask.session_id))
    }

    /// One request as it stands (a pending one past its time is expired first).
    ///
    /// # Errors
    /// A database error.
    pub async fn get_approval(&self, id: Uuid) -> Result<Option<ApprovalRow>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let expired = sqlx::query("SELECT agentloop_expire_approval($1)")
            .bind(id)
            .execute(&mut *conn)
            .await;
        conn.settle(expired)
            .map_err(|err| translate(err, Uuid::nil()))?;
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, ApprovalRow>(concat!(
            "SELECT ",
            approval_columns!(),
            " FROM tool_approvals WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// An operator's answer; the request as it stands after it (unchanged unless it was
    /// pending), `None` when there is no such request.
    ///
    /// # Errors
    /// A database error.
    pub async fn resolve_approval(
        &self,
        id: Uuid,
        approve: bool,
        always: bool,
        by: &str,
    ) -> Result<Option<ApprovalRow>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, ApprovalRow>(concat!(
            "SELECT ",
            approval_columns!(),
            " FROM agentloop_resolve_approval($1, $2, $3, $4)"
        ))
        .bind(id)
        .bind(approve)
        .bind(always)
        .bind(by)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Requests still pending and not past their time, oldest first.
    ///
    /// # Errors
    /// A database error.
    pub async fn list_approvals(&self) -> Result<Vec<ApprovalRow>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, ApprovalRow>(concat!(
            "SELECT ",
            approval_columns!(),
            " FROM tool_approvals \
             WHERE status = 'pending' AND expires_at > now() ORDER BY created_at LIMIT 1000"
        ))
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }
}
