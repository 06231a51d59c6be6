//! SessionService calls on a session's inbox: enqueue (optionally claiming and taking in the
//! same transaction), flush to disk, and take queued inputs into a live run.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{bounded_limit, inbox_item, parse_id, parse_ttl, require, take_response};
use crate::MemoryError;
use crate::store::{self, InboxKind};

impl SessionApi {
    /// The inbox cap to tell a caller, only when it refused the caller's input.
    fn cap_when(&self, queue_full: bool) -> u64 {
        if queue_full {
            self.inbox_max_pending
        } else {
            0
        }
    }

    /// `Enqueue`: an input into the inbox, and with a claim owner the lease and first take too.
    pub(super) async fn enqueue(
        &self,
        req: pb::EnqueueRequest,
    ) -> Result<pb::EnqueueResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        require("idempotency_key", &req.idempotency_key)?;
        let kind: InboxKind = req.kind.parse()?;
        let store = self.store()?;
        if req.claim_owner.is_empty() {
            let enqueued = store
                .enqueue(session_id, &req.idempotency_key, kind, &req.payload)
                .await?;
            return Ok(pb::EnqueueResponse {
                inserted: enqueued.inserted,
                seq: enqueued.seq,
                queue_full: enqueued.queue_full,
                inbox_max_pending: self.cap_when(enqueued.queue_full),
                ..Default::default()
            });
        }
        // The new owner's first call would be TakeNext: answering it here, in the same
        // transaction, saves a round trip and a commit.
        let (enqueued, claim, taken) = store
            .enqueue_claim_take(
                session_id,
                &req.idempotency_key,
                kind,
                &req.payload,
                &req.claim_owner,
                parse_ttl(req.claim_ttl_ms)?,
                req.take_when_claimed.then_some(store::HistoryAsk {
                    limit: bounded_limit(req.history_limit, 0, self.history_cap()),
                    after_seq: req.history_after_seq,
                }),
            )
            .await?;
        let taken = taken.map(|(taken, history)| match taken {
            Some(taken) => take_response(taken, history),
            None => pb::TakeNextResponse::default(),
        });
        Ok(pb::EnqueueResponse {
            inserted: enqueued.inserted,
            seq: enqueued.seq,
            claimed: claim.claimed,
            epoch: claim.epoch,
            owner: claim.owner.unwrap_or_default(),
            taken,
            queue_full: enqueued.queue_full,
            inbox_max_pending: self.cap_when(enqueued.queue_full),
        })
    }

    /// `Flush`: makes earlier writes durable and answers which of the given rows exist.
    pub(super) async fn flush(
        &self,
        req: pb::FlushRequest,
    ) -> Result<pb::FlushResponse, MemoryError> {
        let rows: Vec<(i64, String)> = req
            .rows
            .into_iter()
            .map(|row| (row.seq, row.idempotency_key))
            .collect();
        let durable = self.store()?.flush(&rows).await?;
        Ok(pb::FlushResponse {
            durable: durable
                .into_iter()
                .map(|(seq, idempotency_key)| pb::InboxRow {
                    seq,
                    idempotency_key,
                })
                .collect(),
        })
    }

    /// `TakeQueued`: the queued inputs of the given kinds, handed to the live run.
    pub(super) async fn take_queued(
        &self,
        req: pb::TakeQueuedRequest,
    ) -> Result<pb::TakeQueuedResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let run_id = parse_id("run_id", &req.run_id)?;
        let items = self
            .store()?
            .take_queued(session_id, req.epoch, run_id, &req.kinds)
            .await?;
        Ok(pb::TakeQueuedResponse {
            items: items.into_iter().map(inbox_item).collect(),
        })
    }
}
