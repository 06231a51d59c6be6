//! SessionService calls for auth-profile cooldowns.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{require, timestamp};
use crate::MemoryError;
use crate::store::cooldowns::Cooldown;

fn message(cooldown: Cooldown) -> pb::ProfileCooldown {
    pb::ProfileCooldown {
        provider: cooldown.provider,
        profile: cooldown.profile,
        failures: cooldown.failures,
        cooldown_until: cooldown.cooldown_until.map(timestamp),
        last_error: cooldown.last_error.unwrap_or_default(),
    }
}

/// `GetCooldowns`: the provider's auth profiles cooling down now.
pub(super) async fn get(
    api: &SessionApi,
    req: pb::GetCooldownsRequest,
) -> Result<pb::GetCooldownsResponse, MemoryError> {
    require("provider", &req.provider)?;
    let cooldowns = api.store()?.active_cooldowns(&req.provider).await?;
    Ok(pb::GetCooldownsResponse {
        cooldowns: cooldowns.into_iter().map(message).collect(),
    })
}

/// `ReportProfileFailure`: counts a profile's failure and lengthens its cooldown.
pub(super) async fn failure(
    api: &SessionApi,
    req: pb::ReportProfileFailureRequest,
) -> Result<pb::ProfileCooldown, MemoryError> {
    require("provider", &req.provider)?;
    require("profile", &req.profile)?;
    let cooldown = api
        .store()?
        .report_profile_failure(
            &req.provider,
            &req.profile,
            &req.error,
            i64::try_from(req.base_ms).unwrap_or(i64::MAX),
            i64::try_from(req.max_ms).unwrap_or(i64::MAX),
        )
        .await?;
    Ok(message(cooldown))
}

/// `ReportProfileSuccess`: forgets a profile's failures.
pub(super) async fn success(
    api: &SessionApi,
    req: pb::ReportProfileSuccessRequest,
) -> Result<pb::ReportProfileSuccessResponse, MemoryError> {
    require("provider", &req.provider)?;
    require("profile", &req.profile)?;
    api.store()?
        .report_profile_success(&req.provider, &req.profile)
        .await?;
    Ok(pb::ReportProfileSuccessResponse {})
}
