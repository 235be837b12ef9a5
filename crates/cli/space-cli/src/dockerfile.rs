//! Reading a Dockerfile into a template build: its base image and its steps (pure; the
//! caller packs each `COPY`'s sources from the build context and uploads them).
//!
//! Supported: one stage (`FROM image [AS name]`), `RUN` (shell and JSON forms), `COPY` and
//! `ADD` of context files and directories (`--chown`), `ENV`, `ARG` (with `--build-arg`
//! values; in `RUN` they are in the environment, as Docker has them), `WORKDIR`, `USER`, line
//! continuations, comments and `$VAR`/`${VAR}`/`${VAR:-default}`/`${VAR:+alt}` in the
//! instructions Docker expands them in. Refused with a clear error: a second `FROM`
//! (multi-stage builds), `COPY --from`, `ADD` of a URL, `RUN --mount`. Wildcard sources
//! and `.dockerignore` are the build context's business (`build_context`).
//! Ignored, with a warning: `CMD`, `ENTRYPOINT`, `LABEL`, `EXPOSE`, `VOLUME`, `HEALTHCHECK`,
//! `STOPSIGNAL`, `SHELL`, `ONBUILD`, `MAINTAINER`.

use std::collections::BTreeMap;

use space_core::build_steps::{BuildStep, RunCommand};

/// A Dockerfile as a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerBuild {
    /// The `FROM` image.
    pub from: String,
    /// Its steps.
    pub steps: Vec<PlannedStep>,
    /// Instructions that were ignored, for the user to see.
    pub warnings: Vec<String>,
}

/// A step before its files are packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedStep {
    /// Ready as it is.
    Step(BuildStep),
    /// A `COPY`: `sources` (relative to the context) into `dest`.
    Copy {
        /// Paths in the build context.
        sources: Vec<String>,
        /// Where they go.
        dest: String,
        /// Their owner.
        chown: Option<String>,
    },
}

/// Why a Dockerfile cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {reason}")]
pub struct DockerfileError {
    /// Where (from 1).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// Reads `text`; `build_args` are `--build-arg NAME=VALUE`s.
pub fn parse(
    text: &str,
    build_args: &BTreeMap<String, String>,
) -> Result<DockerBuild, DockerfileError> {
    let mut from: Option<String> = None;
    let mut steps = Vec::new();
    let mut warnings = Vec::new();
    // ARGs in scope (declared, with their values) and ENV set so far, for expansion.
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (line, instruction) in logical_lines(text) {
        let err = |reason: String| DockerfileError { line, reason };
        let (keyword, rest) = match instruction.split_once(char::is_whitespace) {
            Some((k, r)) => (k.to_ascii_uppercase(), r.trim().to_owned()),
            None => (instruction.to_ascii_uppercase(), String::new()),
        };
        let vars = |args: &BTreeMap<String, String>, env: &BTreeMap<String, String>| {
            let mut all = args.clone();
            all.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
            all
        };
        if from.is_none() && !matches!(keyword.as_str(), "FROM" | "ARG") {
            return Err(err(format!("{keyword} before FROM")));
        }
        match keyword.as_str() {
            "FROM" => {
                if from.is_some() {
                    return Err(err(
                        "a second FROM: multi-stage builds are not supported".into()
                    ));
                }
                let words: Vec<&str> = rest.split_whitespace().collect();
                let image = match words.as_slice() {
                    [image] => image,
                    [image, as_kw, _] if as_kw.eq_ignore_ascii_case("as") => image,
                    _ => return Err(err("FROM takes an image (and `AS name`)".into())),
                };
                if image.starts_with("--") {
                    return Err(err("FROM's flags (--platform) are not supported".into()));
                }
                let image = expand(image, &args).map_err(err)?;
                from = Some(image);
                // ARGs before FROM are only for FROM (Docker's rule).
                args.clear();
            }
            "ARG" => {
                let (name, default) = match rest.split_once('=') {
                    Some((n, d)) => (n.trim().to_owned(), Some(unquote(d.trim()))),
                    None => (rest.trim().to_owned(), None),
                };
                if !space_core::build_steps::validate_env_name(&name) {
                    return Err(err(format!("ARG: invalid name {name:?}")));
                }
                let value = match build_args.get(&name) {
                    Some(v) => v.clone(),
                    None => match default {
                        Some(d) => expand(&d, &vars(&args, &env)).map_err(err)?,
                        None => String::new(),
                    },
                };
                args.insert(name, value);
            }
            "RUN" => {
                if rest.starts_with("--") {
                    return Err(err(
                        "RUN's flags (--mount, --network, --security) are not supported".into(),
                    ));
                }
                let command = match json_array(&rest) {
                    Some(argv) => RunCommand::Exec(argv),
                    None => RunCommand::Shell(with_args(&rest, &args, &env)),
                };
                steps.push(PlannedStep::Step(BuildStep::Run(command)));
            }
            "COPY" | "ADD" => {
                let vars = vars(&args, &env);
                let mut chown = None;
                let mut words: Vec<String> = match json_array(&rest) {
                    Some(w) => w,
                    None => rest.split_whitespace().map(str::to_owned).collect(),
                };
                while words.first().is_some_and(|w| w.starts_with("--")) {
                    let flag = words.remove(0);
                    if let Some(user) = flag.strip_prefix("--chown=") {
                        chown = Some(expand(user, &vars).map_err(err)?);
                    } else if flag.starts_with("--from") {
                        return Err(err(format!(
                            "{keyword} --from: multi-stage builds are not supported"
                        )));
                    } else {
                        return Err(err(format!("{keyword}: flag {flag} is not supported")));
                    }
                }
                if words.len() < 2 {
                    return Err(err(format!("{keyword} takes sources and a destination")));
                }
                let mut words = words
                    .iter()
                    .map(|w| expand(w, &vars))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?;
                let dest = words.pop().unwrap_or_default();
                for s in &words {
                    if s.contains("://") {
                        return Err(err(format!("{keyword} of a URL is not supported: {s}")));
                    }
                }
                steps.push(PlannedStep::Copy {
                    sources: words,
                    dest,
                    chown,
                });
            }
            "ENV" => {
                let pairs = env_pairs(&rest).map_err(err)?;
                let mut set = BTreeMap::new();
                for (k, v) in pairs {
                    let v = expand(&v, &vars(&args, &env)).map_err(err)?;
                    env.insert(k.clone(), v.clone());
                    set.insert(k, v);
                }
                steps.push(PlannedStep::Step(BuildStep::Env(set)));
            }
            "WORKDIR" => {
                let dir = expand(&unquote(&rest), &vars(&args, &env)).map_err(err)?;
                steps.push(PlannedStep::Step(BuildStep::Workdir(dir)));
            }
            "USER" => {
                let user = expand(&rest, &vars(&args, &env)).map_err(err)?;
                steps.push(PlannedStep::Step(BuildStep::User(user)));
            }
            "CMD" | "ENTRYPOINT" | "LABEL" | "EXPOSE" | "VOLUME" | "HEALTHCHECK" | "STOPSIGNAL"
            | "SHELL" | "ONBUILD" | "MAINTAINER" => {
                warnings.push(format!("line {line}: {keyword} is ignored"));
            }
            other => return Err(err(format!("unknown instruction {other}"))),
        }
    }
    let from = from.ok_or(DockerfileError {
        line: 0,
        reason: "no FROM".into(),
    })?;
    Ok(DockerBuild {
        from,
        steps,
        warnings,
    })
}

/// The instructions, with comments and blank lines dropped and continuations joined, each
/// with the line it starts on.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        let entry = current.get_or_insert_with(|| (i + 1, String::new()));
        if !entry.1.is_empty() && !body.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body.trim());
        if !continues {
            if let Some(done) = current.take() {
                if !done.1.is_empty() {
                    out.push(done);
                }
            }
        }
    }
    if let Some(done) = current.filter(|d| !d.1.is_empty()) {
        out.push(done);
    }
    out
}

/// `["a", "b"]` as its strings, if it is a JSON array of strings.
fn json_array(s: &str) -> Option<Vec<String>> {
    if !s.starts_with('[') {
        return None;
    }
    serde_json::from_str(s).ok()
}

/// A shell line with the ARGs in scope in its environment (exported first), as Docker
/// gives them to `RUN`; ARGs that an ENV overrides are left to the ENV.
fn with_args(
    line: &str,
    args: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
) -> String {
    let exports: Vec<String> = args
        .iter()
        .filter(|(k, _)| !env.contains_key(*k))
        .map(|(k, v)| format!("export {k}={};", shell_quote(v)))
        .collect();
    if exports.is_empty() {
        line.to_owned()
    } else {
        format!("{} {line}", exports.join(" "))
    }
}

fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].to_owned();
        }
    }
    s.to_owned()
}

/// `K=V K2="v 2"` or the old `K V W` (one variable, the rest its value).
fn env_pairs(rest: &str) -> Result<Vec<(String, String)>, String> {
    let first = rest.split_whitespace().next().unwrap_or("");
    if !first.contains('=') {
        let (k, v) = rest
            .split_once(char::is_whitespace)
            .ok_or_else(|| "ENV needs NAME=VALUE".to_owned())?;
        return check_env(vec![(k.to_owned(), v.trim().to_owned())]);
    }
    let mut pairs = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            if c.is_whitespace() {
                return Err(format!("ENV: {key} has no value (NAME=VALUE)"));
            }
            key.push(c);
            chars.next();
        }
        chars.next();
        let mut value = String::new();
        let mut quote: Option<char> = None;
        while let Some(&c) = chars.peek() {
            match (quote, c) {
                (None, c) if c.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (_, '\\') => {
                    chars.next();
                    if let Some(&n) = chars.peek() {
                        value.push(n);
                    }
                }
                (_, c) => value.push(c),
            }
            chars.next();
        }
        if quote.is_some() {
            return Err(format!("ENV {key}: unterminated quote"));
        }
        pairs.push((key, value));
    }
    check_env(pairs)
}

fn check_env(pairs: Vec<(String, String)>) -> Result<Vec<(String, String)>, String> {
    for (k, _) in &pairs {
        if !space_core::build_steps::validate_env_name(k) {
            return Err(format!("ENV: invalid name {k:?}"));
        }
    }
    Ok(pairs)
}

/// Expands `$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:+alt}`; `\$` is a dollar sign.
fn expand(s: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' if chars.peek() == Some(&'{') => {
                chars.next();
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => return Err(format!("unterminated ${{ in {s:?}")),
                    }
                }
                let value = |n: &str| vars.get(n).filter(|v| !v.is_empty()).cloned();
                if let Some((name, default)) = inner.split_once(":-") {
                    out.push_str(&value(name).unwrap_or_else(|| default.to_owned()));
                } else if let Some((name, alt)) = inner.split_once(":+") {
                    if value(name).is_some() {
                        out.push_str(alt);
                    }
                } else {
                    out.push_str(vars.get(&inner).map(String::as_str).unwrap_or(""));
                }
            }
            '$' if chars
                .peek()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_') =>
            {
                let mut name = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        name.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(vars.get(&name).map(String::as_str).unwrap_or(""));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(text: &str) -> Vec<PlannedStep> {
        parse(text, &BTreeMap::new()).unwrap().steps
    }

    #[test]
    fn a_typical_dockerfile() {
        let text = r#"
# syntax=docker/dockerfile:1
ARG BASE=registry.local/python
FROM ${BASE}:3.12 AS app
ARG VERSION=1.0
ENV APP_HOME=/srv/app \
    GREETING="hello world"
WORKDIR $APP_HOME
COPY --chown=app requirements.txt ./
RUN apt-get update && \
    apt-get install -y curl
RUN ["/bin/echo", "exec form"]
USER app
EXPOSE 8080
CMD ["python", "app.py"]
"#;
        let b = parse(text, &BTreeMap::new()).unwrap();
        assert_eq!(b.from, "registry.local/python:3.12");
        assert_eq!(b.warnings.len(), 2);
        assert_eq!(
            b.steps[0],
            PlannedStep::Step(BuildStep::Env(BTreeMap::from([
                ("APP_HOME".into(), "/srv/app".into()),
                ("GREETING".into(), "hello world".into()),
            ])))
        );
        assert_eq!(
            b.steps[1],
            PlannedStep::Step(BuildStep::Workdir("/srv/app".into()))
        );
        assert_eq!(
            b.steps[2],
            PlannedStep::Copy {
                sources: vec!["requirements.txt".into()],
                dest: "./".into(),
                chown: Some("app".into()),
            }
        );
        assert_eq!(
            b.steps[3],
            PlannedStep::Step(BuildStep::Run(RunCommand::Shell(
                "export VERSION='1.0'; apt-get update && apt-get install -y curl".into()
            )))
        );
        assert_eq!(
            b.steps[4],
            PlannedStep::Step(BuildStep::Run(RunCommand::Exec(vec![
                "/bin/echo".into(),
                "exec form".into()
            ])))
        );
        assert_eq!(b.steps[5], PlannedStep::Step(BuildStep::User("app".into())));
    }

    #[test]
    fn build_args_override_defaults() {
        let args = BTreeMap::from([("V".to_string(), "it's 2".to_string())]);
        let b = parse("FROM x\nARG V=1\nRUN echo $V", &args).unwrap();
        assert_eq!(
            b.steps[0],
            PlannedStep::Step(BuildStep::Run(RunCommand::Shell(
                r"export V='it'\''s 2'; echo $V".into()
            )))
        );
    }

    #[test]
    fn expansion_forms() {
        let vars = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(
            expand("$A-${A}-${B:-d}-${A:+alt}-${B:+no}-\\$A", &vars).unwrap(),
            "1-1-d-alt--$A"
        );
        assert!(expand("${A", &vars).is_err());
    }

    #[test]
    fn what_is_refused_says_where() {
        for (text, line) in [
            ("FROM a\nFROM b", 2),
            ("RUN x", 1),
            ("FROM a\n\nCOPY --from=b /x /y", 3),
            ("FROM a\nADD https://x/y /z", 2),
            ("FROM a\nRUN --mount=type=cache,target=/x make", 2),
            ("FROM a\nFROBNICATE", 2),
            ("FROM a\nENV A", 2),
            ("FROM a\nCOPY onlyone", 2),
        ] {
            let e = parse(text, &BTreeMap::new()).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
        assert!(parse("# nothing", &BTreeMap::new()).is_err());
    }

    #[test]
    fn continuations_and_comments() {
        let s = steps("FROM a\nRUN one \\\n# a comment inside\n  two\n");
        assert_eq!(
            s,
            vec![PlannedStep::Step(BuildStep::Run(RunCommand::Shell(
                "one two".into()
            )))]
        );
    }
}
