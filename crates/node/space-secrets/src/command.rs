//! The command backend: values come from an external credential helper, in the manner of git
//! credential helpers, so a node can use a vault, a cloud secret manager or a password store
//! without this crate knowing any of them.
//!
//! Protocol (one run of the configured program per operation; the action is appended to the
//! configured arguments; `key=value` lines, each ending in `\n`, then an empty line):
//!
//! ```text
//! <program> <args…> get        stdin:  id=crd-…\nname=github\nscope=tenant:tnt-…\n\n
//!                              stdout: value=<the secret>\n   (other key= lines ignored)
//! <program> <args…> store      stdin:  id=…\nname=…\nscope=…\nvalue=<the secret>\n\n
//! <program> <args…> erase      stdin:  id=…\nname=…\nscope=…\n\n
//! ```
//!
//! Running the helper (process group, bounded output, timeout, stderr tail, no stdout in
//! errors) is [`space_helper`]'s, shared with the key services' helpers. Standard output is
//! read up to [`MAX_COMMAND_OUTPUT`] bytes. Since the protocol is line based, a value to
//! `store` may not contain CR or LF.
//!
//! A helper only knows values: metadata lives in a JSON file next to the node's other state,
//! `{"format": "space-secrets/command-metadata/v1", "credentials": [<Credential>, …]}`, mode
//! 0600, replaced atomically. Unlike the encrypted store's metadata it is not authenticated:
//! it is as trusted as the node's configuration files. Values are cached by the manager
//! ([`crate::cache`]), so the helper runs once per credential per TTL, not per request.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use space_helper::{HelperCommand, HelperError};
use zeroize::Zeroizing;

use crate::backend::{BackendError, BoxFuture, SecretBackend};
use crate::fsutil;
use crate::model::{Credential, CredentialId};
use crate::secret::{SecretValue, MAX_SECRET_LEN};
use crate::store::MAX_STORED_CREDENTIALS;

/// Most bytes read from a helper's standard output: a maximal value plus room for its key and
/// a few other lines.
pub const MAX_COMMAND_OUTPUT: usize = MAX_SECRET_LEN + 4 * 1024;
/// Largest metadata file read.
pub const MAX_METADATA_FILE_LEN: usize = 16 * 1024 * 1024;
/// The `format` field of the metadata file.
pub const METADATA_FILE_FORMAT: &str = "space-secrets/command-metadata/v1";

/// What the helper is asked to do (its last argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Print the value.
    Get,
    /// Keep the value given on stdin.
    Store,
    /// Forget the value.
    Erase,
}

impl Action {
    /// The argument passed to the helper.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Get => "get",
            Action::Store => "store",
            Action::Erase => "erase",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a helper run failed. Never contains anything the helper wrote to standard output.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The helper could not be run, failed or did not answer in time.
    #[error("credential {0}")]
    Run(#[from] HelperError),
    /// The program's output is not in the protocol (the output itself is not repeated).
    #[error("credential helper {program} {action}: malformed output: {problem}")]
    Malformed {
        /// The program.
        program: PathBuf,
        /// The action.
        action: Action,
        /// What is wrong.
        problem: &'static str,
    },
    /// The value cannot be passed to a line-based helper.
    #[error("credential helper: a value containing CR or LF cannot be stored")]
    ValueNotLineSafe,
}

/// How to run the helper.
pub type CommandConfig = HelperCommand;

/// The metadata file (see the module doc).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetadataFile {
    format: String,
    credentials: Vec<Credential>,
}

/// Values from an external helper, metadata in a local JSON file (see the module doc).
pub struct CommandBackend {
    config: CommandConfig,
    metadata_path: PathBuf,
    /// Serialises read-modify-write of the metadata file.
    metadata_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for CommandBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandBackend")
            .field("config", &self.config)
            .field("metadata_path", &self.metadata_path)
            .finish()
    }
}

impl CommandBackend {
    /// A backend running `config`'s program, with metadata kept at `metadata_path` (created on
    /// first write; its directory too, mode 0700).
    pub fn new(
        config: CommandConfig,
        metadata_path: impl Into<PathBuf>,
    ) -> Result<Self, CommandError> {
        config.validate().map_err(CommandError::Run)?;
        Ok(Self {
            config,
            metadata_path: metadata_path.into(),
            metadata_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Runs the helper for `action` on `credential` (and `value` for `store`), returning its
    /// standard output (wiped on drop).
    pub async fn run(
        &self,
        action: Action,
        credential: &Credential,
        value: Option<&SecretValue>,
    ) -> Result<Zeroizing<Vec<u8>>, CommandError> {
        let mut input = Zeroizing::new(String::with_capacity(256 + value.map_or(0, |v| v.len())));
        input.push_str("id=");
        input.push_str(credential.id.as_str());
        input.push_str("\nname=");
        input.push_str(credential.name.as_str());
        input.push_str("\nscope=");
        input.push_str(&credential.scope.to_string());
        input.push('\n');
        if let Some(value) = value {
            if value.expose().contains(['\r', '\n']) {
                return Err(CommandError::ValueNotLineSafe);
            }
            input.push_str("value=");
            input.push_str(value.expose());
            input.push('\n');
        }
        input.push('\n');

        Ok(self
            .config
            .run(action.as_str(), input.as_bytes(), MAX_COMMAND_OUTPUT)
            .await?)
    }

    async fn read_metadata(&self) -> Result<Vec<Credential>, BackendError> {
        let path = self.metadata_path.clone();
        let bytes =
            tokio::task::spawn_blocking(move || fsutil::read_bounded(&path, MAX_METADATA_FILE_LEN))
                .await
                .map_err(|e| BackendError::Task(e.to_string()))?;
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(BackendError::Io {
                    path: self.metadata_path.clone(),
                    source,
                })
            }
        };
        let corrupt = |reason: String| BackendError::Corrupt {
            path: self.metadata_path.clone(),
            reason,
        };
        let file: MetadataFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.format != METADATA_FILE_FORMAT {
            return Err(corrupt(format!("unknown format {:?}", file.format)));
        }
        if file.credentials.len() > MAX_STORED_CREDENTIALS {
            return Err(BackendError::TooMany(MAX_STORED_CREDENTIALS));
        }
        for c in &file.credentials {
            c.validate()?;
        }
        Ok(file.credentials)
    }

    async fn write_metadata(&self, credentials: Vec<Credential>) -> Result<(), BackendError> {
        let path = self.metadata_path.clone();
        let file = MetadataFile {
            format: METADATA_FILE_FORMAT.to_owned(),
            credentials,
        };
        let mut bytes = serde_json::to_vec_pretty(&file).map_err(|e| BackendError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        tokio::task::spawn_blocking(move || {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .to_owned();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            fsutil::ensure_private_dir(&dir)
                .and_then(|()| fsutil::write_atomic(&dir, &name, &bytes))
                .map_err(|source| BackendError::Io { path, source })
        })
        .await
        .map_err(|e| BackendError::Task(e.to_string()))?
    }
}

/// Finds the single `value=` line in a `get` answer (lines up to the first empty one).
fn parse_value(out: &[u8]) -> Result<SecretValue, &'static str> {
    let text = std::str::from_utf8(out).map_err(|_| "not UTF-8")?;
    let mut found: Option<&str> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("value=") {
            if found.is_some() {
                return Err("more than one value= line");
            }
            found = Some(v);
        }
    }
    let value = found.ok_or("no value= line")?;
    SecretValue::new(value.to_owned()).map_err(|e| match e {
        crate::secret::SecretError::Empty => "empty value",
        crate::secret::SecretError::TooLong { .. } => "value too long",
        crate::secret::SecretError::Nul => "value contains NUL",
        _ => "invalid value",
    })
}

impl SecretBackend for CommandBackend {
    fn kind(&self) -> &'static str {
        "command"
    }

    fn get<'a>(
        &'a self,
        credential: &'a Credential,
    ) -> BoxFuture<'a, Result<SecretValue, BackendError>> {
        Box::pin(async move {
            let out = self.run(Action::Get, credential, None).await?;
            parse_value(&out).map_err(|problem| {
                BackendError::Command(CommandError::Malformed {
                    program: self.config.program.clone(),
                    action: Action::Get,
                    problem,
                })
            })
        })
    }

    fn put<'a>(
        &'a self,
        credential: &'a Credential,
        value: &'a SecretValue,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            credential.validate()?;
            let _guard = self.metadata_lock.lock().await;
            let mut all = self.read_metadata().await?;
            if !all.iter().any(|c| c.id == credential.id) && all.len() >= MAX_STORED_CREDENTIALS {
                return Err(BackendError::TooMany(MAX_STORED_CREDENTIALS));
            }
            self.run(Action::Store, credential, Some(value)).await?;
            all.retain(|c| c.id != credential.id);
            all.push(credential.clone());
            self.write_metadata(all).await
        })
    }

    fn delete<'a>(&'a self, id: &'a CredentialId) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let _guard = self.metadata_lock.lock().await;
            let mut all = self.read_metadata().await?;
            let Some(credential) = all.iter().find(|c| &c.id == id).cloned() else {
                return Err(BackendError::NotFound(id.clone()));
            };
            self.run(Action::Erase, &credential, None).await?;
            all.retain(|c| &c.id != id);
            self.write_metadata(all).await
        })
    }

    fn list_metadata(&self) -> BoxFuture<'_, Result<Vec<Credential>, BackendError>> {
        Box::pin(async move { self.read_metadata().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Scope;
    use crate::testutil::{bearer_rule, credential, tenant};
    use space_helper::DEFAULT_HELPER_TIMEOUT as DEFAULT_COMMAND_TIMEOUT;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// Writes a shell script `name` into `dir`. Tests run it as `/bin/sh <script>` rather than
    /// executing it: executing a file just written races with forks in other test threads
    /// (ETXTBSY).
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        path
    }

    fn backend(dir: &Path, script: PathBuf, timeout: Duration) -> CommandBackend {
        let mut config = CommandConfig::new("/bin/sh");
        config.args = vec![script.to_string_lossy().into_owned()];
        config.timeout = timeout;
        CommandBackend::new(config, dir.join("state/credentials.json")).unwrap()
    }

    fn github() -> Credential {
        credential(
            "github",
            Scope::Tenant { tenant: tenant() },
            bearer_rule(&["api.github.com"]),
        )
    }

    /// A helper keeping values in files next to itself, one per id; logs its input's keys.
    const FILE_HELPER: &str = r#"
dir=$(dirname "$0")
input=$(cat)
id=$(printf '%s\n' "$input" | sed -n 's/^id=//p')
printf '%s\n' "$input" | sed 's/=.*//' | tr '\n' ' ' >> "$dir/keys.log"; echo "$1" >> "$dir/keys.log"
case "$1" in
  get) [ -f "$dir/$id.value" ] || { echo "no such credential $id" >&2; exit 4; }
       echo "comment=found"; printf 'value=%s\n' "$(cat "$dir/$id.value")"; echo; echo "value=ignored after blank" ;;
  store) printf '%s\n' "$input" | sed -n 's/^value=//p' > "$dir/$id.value" ;;
  erase) rm -f "$dir/$id.value" ;;
  *) exit 2 ;;
esac
"#;

    #[tokio::test]
    async fn store_get_erase_through_the_helper() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(
            dir.path(),
            script(dir.path(), "helper", FILE_HELPER),
            DEFAULT_COMMAND_TIMEOUT,
        );
        let c = github();
        b.put(
            &c,
            &SecretValue::new("s3cr3t value=with equals".into()).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(
            b.get(&c).await.unwrap().expose(),
            "s3cr3t value=with equals"
        );
        assert_eq!(b.list_metadata().await.unwrap(), vec![c.clone()]);
        let meta = dir.path().join("state/credentials.json");
        assert_eq!(
            std::fs::metadata(&meta).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!std::fs::read_to_string(&meta).unwrap().contains("s3cr3t"));
        let log = std::fs::read_to_string(dir.path().join("keys.log")).unwrap();
        assert!(log.contains("id name scope value store"), "{log}");
        assert!(log.contains("id name scope get"), "{log}");

        b.delete(&c.id).await.unwrap();
        assert!(b.list_metadata().await.unwrap().is_empty());
        assert!(matches!(
            b.delete(&c.id).await,
            Err(BackendError::NotFound(_))
        ));
        // The helper forgot it: its error comes back with its stderr.
        let err = b.get(&c).await.unwrap_err().to_string();
        assert!(err.contains("no such credential"), "{err}");
        assert!(err.contains("exit status: 4"), "{err}");
    }

    #[tokio::test]
    async fn a_failing_helper_reports_stderr_but_never_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(
            dir.path(),
            "fails",
            "cat >/dev/null; echo 'value=leaked-secret-123'; printf 'vault is sealed\\r\\n\\033[31mred\\n' >&2; exit 3",
        );
        let b = backend(dir.path(), program, DEFAULT_COMMAND_TIMEOUT);
        let err = b.get(&github()).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                BackendError::Command(CommandError::Run(HelperError::Failed { .. }))
            ),
            "{text}"
        );
        assert!(text.contains("vault is sealed"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(!text.contains("leaked-secret-123"), "{text}");
        assert!(!format!("{err:?}").contains("leaked-secret-123"));
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    }

    #[tokio::test]
    async fn a_slow_helper_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let program = script(
            dir.path(),
            "slow",
            &format!("sleep 30 & echo $! > {}; wait", pid_file.display()),
        );
        let b = backend(dir.path(), program, Duration::from_millis(300));
        let started = Instant::now();
        let err = b.get(&github()).await.unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::Command(CommandError::Run(HelperError::Timeout { .. }))
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // The helper's own child (same process group) is gone too.
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc_dir = format!("/proc/{}", pid.trim());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("{proc_dir}/stat")).ok();
            // Gone, or a zombie waiting for its reaper.
            if state.as_deref().is_none_or(|s| s.contains(") Z")) {
                break;
            }
            assert!(Instant::now() < deadline, "sleep {pid} still running");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn oversized_output_is_refused_early() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(
            dir.path(),
            "chatty",
            "cat >/dev/null; yes value=aaaaaaaaaaaaaaaa",
        );
        let b = backend(dir.path(), program, Duration::from_secs(20));
        let started = Instant::now();
        let err = b.get(&github()).await.unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::Command(CommandError::Run(HelperError::OutputTooLarge { .. }))
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn malformed_answers_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        for (name, body, problem) in [
            ("none", "echo 'password=x'", "no value= line"),
            (
                "two",
                "echo value=a; echo value=b",
                "more than one value= line",
            ),
            ("empty", "echo value=", "empty value"),
            ("binary", "printf 'value=\\377\\n'", "not UTF-8"),
        ] {
            let b = backend(
                dir.path(),
                script(dir.path(), name, body),
                DEFAULT_COMMAND_TIMEOUT,
            );
            match b.get(&github()).await {
                Err(BackendError::Command(CommandError::Malformed { problem: p, .. })) => {
                    assert_eq!(p, problem, "{name}")
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        let b = CommandBackend::new(
            CommandConfig::new(dir.path().join("does-not-exist")),
            dir.path().join("m.json"),
        )
        .unwrap();
        assert!(matches!(
            b.get(&github()).await,
            Err(BackendError::Command(CommandError::Run(
                HelperError::Spawn { .. }
            )))
        ));
    }

    #[tokio::test]
    async fn values_with_newlines_cannot_be_stored() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(
            dir.path(),
            script(dir.path(), "helper", FILE_HELPER),
            DEFAULT_COMMAND_TIMEOUT,
        );
        let err = b
            .put(&github(), &SecretValue::new("a\nvalue=b".into()).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            BackendError::Command(CommandError::ValueNotLineSafe)
        ));
        assert!(b.list_metadata().await.unwrap().is_empty());
    }

    #[test]
    fn bad_configurations_are_refused() {
        let mut config = CommandConfig::new("/bin/true");
        config.timeout = space_helper::MAX_HELPER_TIMEOUT + Duration::from_secs(1);
        assert!(CommandBackend::new(config, "/tmp/x").is_err());
        assert!(CommandBackend::new(CommandConfig::new(""), "/tmp/x").is_err());
    }
}
