//! Control plane: HTTP API, authentication, database, reconciler.
