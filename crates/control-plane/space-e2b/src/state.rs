//! What every E2B handler shares: SPACE's application state (database, node), the E2B
//! configuration, the key envd access tokens derive from, and the polled directory
//! watchers of `filesystem.Filesystem/CreateWatcher`.

use std::sync::Arc;

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
}

impl E2bState {
    /// State over SPACE's own.
    pub fn new(app: AppState, config: E2bConfig, tokens: TokenKey) -> Self {
        Self {
            app,
            config: Arc::new(config),
            tokens,
            watchers: Watchers::default(),
        }
    }

    /// The envd access token of sandbox `id`.
    pub fn envd_token(&self, id: &SandboxId) -> String {
        self.tokens.token(id)
    }
}
