//! What every E2B handler shares: SPACE's application state (database, node), the E2B
//! configuration, the key envd access tokens derive from, and the polled directory
//! watchers of `filesystem.Filesystem/CreateWatcher`.

use std::sync::Arc;

use space_control::db::{DbError, SandboxTokens};
use space_control::AppState;
use space_core::SandboxId;

use crate::envd::watchers::Watchers;
use crate::surface::E2bConfig;
use crate::token::TokenKey;

/// Shared state of the E2B API. Cheap to clone.
#[derive(Clone)]
pub struct E2bState {
    /// SPACE's own state: the handlers call the same functions as `/v1`.
    pub app: AppState,
    /// Domain and options.
    pub config: Arc<E2bConfig>,
    /// Derives each sandbox's envd access token.
    pub tokens: TokenKey,
    /// Watchers made by `CreateWatcher`, polled by `GetWatcherEvents`.
    pub watchers: Watchers,
    /// Template builds asked for and their uploaded files (`rest::templates`).
    pub template_builds: crate::build_store::BuildStore,
}

impl E2bState {
    /// State over SPACE's own.
    pub fn new(
        app: AppState,
        config: E2bConfig,
        tokens: TokenKey,
        data_dir: &std::path::Path,
    ) -> Self {
        let template_builds = crate::build_store::BuildStore::new(
            data_dir.join("e2b-template-builds"),
            app.objects.clone(),
        );
        Self {
            app,
            config: Arc::new(config),
            tokens,
            watchers: Watchers::default(),
            template_builds,
        }
    }

    /// The envd access token of sandbox `id` in its current token epoch.
    pub fn envd_token(&self, id: &SandboxId, tokens: SandboxTokens) -> String {
        self.tokens.token(id, tokens.epoch)
    }

    /// Hands the tokens of sandbox `id` to a client (create, connect, get): valid for the
    /// configured time from now (the validity is renewed, the tokens stay the same until a
    /// revocation). `None` if the sandbox is deleted.
    pub async fn hand_out_tokens(&self, id: &SandboxId) -> Result<Option<HandedTokens>, DbError> {
        let ttl_ms =
            i64::try_from(self.config.token_ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let until = space_control::db::now_ms().saturating_add(ttl_ms);
        Ok(self
            .app
            .db
            .renew_tokens(id, until)
            .await?
            .map(|tokens| HandedTokens {
                envd: self.envd_token(id, tokens),
                traffic: self.tokens.traffic_token(id, tokens.epoch),
            }))
    }
}

/// A sandbox's tokens as handed to a client.
pub struct HandedTokens {
    /// `envdAccessToken`.
    pub envd: String,
    /// `trafficAccessToken`.
    pub traffic: String,
}
