//! The image config (the OCI image spec's `config.json`, which Docker's shares): what we
//! read of it, bounded and checked, and the template defaults it gives.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::oci::OciError;

/// Most `Env` entries, `Entrypoint` + `Cmd` arguments and bytes in any one of them.
const MAX_ENV: usize = 512;
const MAX_ARGS: usize = 1024;
const MAX_STRING: usize = 32 * 1024;

/// What SPACE uses of an image config.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageConfig {
    /// `os/architecture[/variant]`.
    pub platform: String,
    /// The uncompressed digest of each layer, lowest first.
    pub diff_ids: Vec<String>,
    /// `Env`, as `NAME=value` parsed.
    pub env: BTreeMap<String, String>,
    /// `WorkingDir`, if set.
    pub working_dir: Option<String>,
    /// `User`, if set (`name`, `uid`, `name:group` or `uid:gid`).
    pub user: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    config: Option<RawContainerConfig>,
    rootfs: RawRootfs,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
struct RawContainerConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
}

fn bad(detail: impl Into<String>) -> OciError {
    OciError::BadImage {
        what: "image config".into(),
        detail: detail.into(),
    }
}

/// A valid environment variable name: what POSIX shells accept.
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl ImageConfig {
    /// Parses and checks a config document.
    pub fn parse(bytes: &[u8]) -> Result<ImageConfig, OciError> {
        let raw: RawConfig =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a config: {e}")))?;
        if raw.rootfs.kind != "layers" {
            return Err(bad(format!(
                "rootfs type {:?} (want \"layers\")",
                raw.rootfs.kind
            )));
        }
        for d in &raw.rootfs.diff_ids {
            crate::oci::fetch::sha256_hex(d)?;
        }
        let platform = match &raw.variant {
            Some(v) => format!("{}/{}/{v}", raw.os, raw.architecture),
            None => format!("{}/{}", raw.os, raw.architecture),
        };
        if raw.os != "linux" || raw.architecture != "amd64" {
            return Err(OciError::NoPlatform {
                available: platform,
            });
        }
        let c = raw.config.unwrap_or(RawContainerConfig {
            env: None,
            working_dir: None,
            user: None,
            entrypoint: None,
            cmd: None,
        });
        let check = |what: &str, s: &str| -> Result<(), OciError> {
            if s.len() > MAX_STRING || s.contains('\0') {
                return Err(bad(format!(
                    "{what}: longer than {MAX_STRING} bytes or has a NUL"
                )));
            }
            Ok(())
        };
        let env_list = c.env.unwrap_or_default();
        if env_list.len() > MAX_ENV {
            return Err(bad(format!(
                "{} Env entries (at most {MAX_ENV})",
                env_list.len()
            )));
        }
        let mut env = BTreeMap::new();
        for e in env_list {
            check("Env", &e)?;
            let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
            if !valid_env_name(k) {
                return Err(bad(format!(
                    "Env name {:?} is not a variable name",
                    k.chars().take(80).collect::<String>()
                )));
            }
            env.insert(k.to_owned(), v.to_owned());
        }
        let entrypoint = c.entrypoint.unwrap_or_default();
        let cmd = c.cmd.unwrap_or_default();
        if entrypoint.len() + cmd.len() > MAX_ARGS {
            return Err(bad(format!(
                "more than {MAX_ARGS} Entrypoint and Cmd arguments"
            )));
        }
        for a in entrypoint.iter().chain(&cmd) {
            check("Entrypoint/Cmd", a)?;
        }
        let working_dir = c.working_dir.filter(|w| !w.is_empty());
        if let Some(w) = &working_dir {
            check("WorkingDir", w)?;
            if !w.starts_with('/') {
                return Err(bad(format!("WorkingDir {w:?} is not absolute")));
            }
        }
        let user = c.user.filter(|u| !u.is_empty());
        if let Some(u) = &user {
            check("User", u)?;
            if u.len() > 256 || u.contains(['\n', '/']) {
                return Err(bad(format!("User {u:?} is not a user")));
            }
        }
        Ok(ImageConfig {
            platform,
            diff_ids: raw.rootfs.diff_ids,
            env,
            working_dir,
            user,
            entrypoint,
            cmd,
        })
    }

    /// The command the image would run (`Entrypoint` then `Cmd`), if any.
    pub fn image_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> String {
        format!(
            r#"{{"architecture":"amd64","os":"linux",{extra}
            "rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
            "a".repeat(64)
        )
    }

    #[test]
    fn reads_the_defaults() {
        let c = ImageConfig::parse(
            config(
                r#""config":{"Env":["PATH=/usr/local/bin:/usr/bin","LANG=C.UTF-8","EMPTY"],
                "WorkingDir":"/app","User":"app","Entrypoint":["python3"],"Cmd":["-m","http.server"]},"#,
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.env["PATH"], "/usr/local/bin:/usr/bin");
        assert_eq!(c.env["EMPTY"], "");
        assert_eq!(c.working_dir.as_deref(), Some("/app"));
        assert_eq!(c.user.as_deref(), Some("app"));
        assert_eq!(c.image_command(), ["python3", "-m", "http.server"]);
        assert_eq!(c.platform, "linux/amd64");
        // No config section at all (a scratch image) is fine.
        assert_eq!(
            ImageConfig::parse(config("").as_bytes()).unwrap().env.len(),
            0
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            config(r#""config":{"Env":["1X=y"]},"#),
            config(r#""config":{"WorkingDir":"relative"},"#),
            config(r#""config":{"User":"a/b"},"#),
            r#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#.into(),
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["md5:00"]}}"#.into(),
            "[]".into(),
        ] {
            assert!(ImageConfig::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(matches!(
            ImageConfig::parse(br#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#),
            Err(OciError::NoPlatform { .. })
        ));
    }
}
