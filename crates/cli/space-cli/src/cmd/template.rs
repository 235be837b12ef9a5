//! `space template`: list, get and remove through the API; build into the local node's
//! store (root), or with `--api` on the server's node.

use std::time::Duration;

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{render, Global};

/// Template commands.
// Parsed once per run: the size of `Build` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// List templates.
    List,
    /// One template, with its defaults and origin.
    Get {
        /// Template name (`NAME` or `NAME:TAG`).
        name: String,
    },
    /// Build a template into the local store (needs root): from SPACE's recipe of that
    /// name, or with `--from` from a container image. With `--file`, from a Dockerfile, on
    /// the server's node (its `RUN`s run in a builder sandbox there).
    Build {
        /// Template name: a recipe's (`base`, `busybox`), or any name with `--from`.
        name: String,
        /// The image to build from: `HOST/REPO:TAG` or `docker://…` (a registry, by tag or
        /// `@sha256:` digest), `oci:DIR[:TAG]` (an OCI layout), `docker-archive:FILE` (a
        /// `docker save` tarball).
        #[arg(long, value_name = "REF", conflicts_with = "file")]
        from: Option<String>,
        /// A Dockerfile to build (through the API, like `--api`): its `FROM` image (a
        /// registry's), then its steps; `COPY` sources come from `--context`.
        #[arg(long, short = 'f', value_name = "DOCKERFILE")]
        file: Option<std::path::PathBuf>,
        /// The build context `COPY` reads from (default: the Dockerfile's directory).
        #[arg(long, value_name = "DIR", requires = "file")]
        context: Option<std::path::PathBuf>,
        /// A Dockerfile `ARG`'s value: `NAME=VALUE` (repeatable).
        #[arg(long, value_name = "NAME=VALUE", requires = "file")]
        build_arg: Vec<String>,
        /// Registry credentials: a Docker-style auth file (`docker login`/`podman login`
        /// write one). Never given on the command line.
        #[arg(long, env = "REGISTRY_AUTH_FILE", value_name = "FILE")]
        registry_auth: Option<std::path::PathBuf>,
        /// Log in to the registry with this stored credential (its name or id; its rule
        /// lists the registry in `registries`) instead of an auth file. Builds through the
        /// API (`--api`, `--file`) only; without it, the caller's credential that lists the
        /// registry is used, if any.
        #[arg(long, value_name = "NAME", conflicts_with = "registry_auth")]
        registry_credential: Option<String>,
        /// CA certificates (PEM) to trust for the registry, besides the system's.
        #[arg(long, value_name = "FILE")]
        registry_ca: Option<std::path::PathBuf>,
        /// Speak plain HTTP to this registry (`HOST:PORT`); repeatable.
        #[arg(long, value_name = "HOST")]
        plain_http: Vec<String>,
        /// The account commands run as by default, instead of the image's `User` (or
        /// `user`, the sandbox user, when the image sets none).
        #[arg(long)]
        user: Option<String>,
        /// The static guest daemon for the kernel bundle (default: `spaced` next to this program).
        #[arg(long, env = "SPACE_SPACED_BIN")]
        spaced: Option<std::path::PathBuf>,
        /// Debian mirror for debootstrap.
        #[arg(long)]
        mirror: Option<String>,
        /// Build on the server's node through the API, following its log, instead of into
        /// this machine's store: the node pulls the image (a registry image only), then
        /// makes its memory image and warm pool (the operator's key builds a shared
        /// template, any other tenant's its own).
        #[arg(long, requires = "from")]
        api: bool,
        /// With `--api` or `--file`: another tag for the build (`NAME:TAG`; repeatable).
        #[arg(long)]
        tag: Vec<String>,
        /// With `--api` or `--file`: a command (a shell line) the template's sandboxes have
        /// running from the start, started before its memory image is saved.
        #[arg(long, value_name = "LINE")]
        start_cmd: Option<String>,
        /// The start command's ready check (a shell line), run every second until it exits
        /// with 0 (e.g. `curl -sf localhost:8000/health`).
        #[arg(long, value_name = "LINE", requires = "start_cmd")]
        ready_cmd: Option<String>,
        /// Longest the ready check may take, in seconds (default 600).
        #[arg(long, value_name = "SECS", requires = "ready_cmd")]
        ready_timeout: Option<u32>,
        /// With `--file`: the disk `RUN` steps run on, MiB, at least (default: the image's
        /// and 2 GiB), for steps that install more.
        #[arg(long, value_name = "MIB", requires = "file")]
        builder_disk: Option<u32>,
    },
    /// The template cache of every node: templates no name points at (build steps' caches,
    /// what a rebuilt name meant before, templates fetched by digest), least recently
    /// needed first.
    Cache,
    /// Remove from every node's cache the templates not needed for a while; those that
    /// sandboxes or snapshots were made from stay.
    Prune {
        /// Remove what was not needed for this long (`90m`, `2d`, `0s` for all unused).
        #[arg(long, value_name = "DURATION", default_value = "1d", value_parser = humantime::parse_duration)]
        unused_for: Duration,
        /// Only list what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove a template name through the API (the template goes with its last name);
    /// refused while sandboxes or snapshots were made from it, unless `--force`.
    Rm {
        /// Template name (`NAME` or `NAME:TAG`).
        name: String,
        /// Remove it even while in use (sandboxes keep their disks).
        #[arg(long)]
        force: bool,
    },
}

/// Runs a template command.
pub async fn run(g: &Global, c: TemplateCmd) -> anyhow::Result<u8> {
    match c {
        TemplateCmd::List => {
            let list = g.client()?.templates().await?;
            if g.json {
                render::json(&list)?;
            } else {
                render::templates(&list);
            }
        }
        TemplateCmd::Cache => {
            let cached = g.client()?.template_cache().await?;
            if g.json {
                render::json(&cached)?;
            } else {
                render::cached_templates(&cached);
            }
        }
        TemplateCmd::Prune {
            unused_for,
            dry_run,
        } => {
            let req = space_core::template::TemplateCachePruneRequest {
                unused_for_secs: Some(unused_for.as_secs()),
                dry_run,
            };
            let pruned = g.client()?.prune_template_cache(&req).await?;
            if g.json {
                render::json(&pruned)?;
            } else {
                render::template_cache_prune(&pruned);
            }
        }
        TemplateCmd::Get { name } => {
            let t = g.client()?.template(&name).await?;
            if g.json {
                render::json(&t)?;
            } else {
                render::templates(std::slice::from_ref(&t));
            }
        }
        TemplateCmd::Build {
            name,
            file: Some(file),
            context,
            build_arg,
            registry_auth,
            registry_credential,
            user,
            tag,
            start_cmd,
            ready_cmd,
            ready_timeout,
            builder_disk,
            ..
        } => {
            let mut req =
                dockerfile_request(g, &name, &file, context, &build_arg, user, tag).await?;
            add_start(&mut req, start_cmd, ready_cmd, ready_timeout);
            if let Some(mib) = builder_disk {
                req["builder_disk_mib"] = mib.into();
            }
            if let Some(credential) = registry_credential {
                req["registry_credential"] = credential.into();
            }
            return follow_build(g, name, req, registry_auth).await;
        }
        TemplateCmd::Build {
            name,
            from: Some(from),
            registry_auth,
            registry_credential,
            user,
            api: true,
            tag,
            start_cmd,
            ready_cmd,
            ready_timeout,
            ..
        } => {
            let mut req = serde_json::json!({"name": name, "from_image": from, "tags": tag});
            if let Some(user) = user {
                req["user"] = user.into();
            }
            if let Some(credential) = registry_credential {
                req["registry_credential"] = credential.into();
            }
            add_start(&mut req, start_cmd, ready_cmd, ready_timeout);
            return follow_build(g, name, req, registry_auth).await;
        }
        TemplateCmd::Build {
            name,
            from,
            registry_auth,
            registry_ca,
            plain_http,
            user,
            spaced,
            mirror,
            tag,
            start_cmd,
            registry_credential,
            ..
        } => {
            if registry_credential.is_some() {
                anyhow::bail!(
                    "--registry-credential is looked up by the server: add --api (or build with --file)"
                );
            }
            if !tag.is_empty() {
                anyhow::bail!(
                    "--tag names a build through the API: add --api (or build with --file)"
                );
            }
            if start_cmd.is_some() {
                anyhow::bail!(
                    "--start-cmd is tried in a sandbox on the server's node: add --api (or build with --file)"
                );
            }
            let spaced = match spaced {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name("spaced"),
            };
            let store = open_store(g)?;
            let spinner = spinner();
            let progress = spinner.clone();
            let kernel_store = store.clone();
            let kernel = tokio::task::spawn_blocking(move || {
                let say = |msg: &str| progress.set_message(msg.to_owned());
                space_images::build_kernel_bundle(
                    &kernel_store,
                    &space_images::KernelOpts::new(spaced),
                    &say,
                )
            })
            .await??;
            let info = match from {
                Some(reference) => {
                    let source = space_images::oci::ImageSource::parse(&reference)?;
                    let opts = space_images::oci::ImageBuildOpts {
                        registry: space_images::oci::registry::RegistryOpts {
                            auth_file: registry_auth,
                            ca_file: registry_ca,
                            plain_http,
                            ..Default::default()
                        },
                        unpacker: std::env::current_exe()?,
                        user,
                        default_resources: space_core::Resources::default(),
                        ..Default::default()
                    };
                    let progress = spinner.clone();
                    let verbose = !crate::term::stderr_is_tty();
                    space_images::oci::build_from_image(
                        &store,
                        &name,
                        &source,
                        &kernel.digest,
                        &opts,
                        std::sync::Arc::new(move |msg: &str| {
                            if verbose {
                                eprintln!("{msg}");
                            }
                            progress.set_message(msg.to_owned())
                        }),
                    )
                    .await?
                }
                None => {
                    let progress = spinner.clone();
                    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                        let say = |msg: &str| progress.set_message(msg.to_owned());
                        let opts = space_images::BuildOpts {
                            mirror,
                            ..Default::default()
                        };
                        Ok(space_images::build_template(
                            &store,
                            &name,
                            &kernel.digest,
                            &opts,
                            &say,
                        )?)
                    })
                    .await??
                }
            };
            spinner.finish_and_clear();
            if g.json {
                render::json(&info)?;
            } else {
                println!(
                    "built template {} ({}, {} MiB)",
                    info.name,
                    render::short(&info.digest),
                    info.image_size_mib
                );
            }
        }
        TemplateCmd::Rm { name, force } => {
            g.client()?.delete_template(&name, force).await?;
            println!("removed template {name}");
        }
    }
    Ok(0)
}

/// The build request for a Dockerfile: its steps, each `COPY`'s sources packed from the
/// context and uploaded (unless the server has them already).
async fn dockerfile_request(
    g: &Global,
    name: &str,
    file: &std::path::Path,
    context: Option<std::path::PathBuf>,
    build_args: &[String],
    user: Option<String>,
    tags: Vec<String>,
) -> anyhow::Result<serde_json::Value> {
    use crate::dockerfile::{self, PlannedStep};
    use space_core::build_steps::{BuildStep, CopyStep};
    let text =
        std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut args = std::collections::BTreeMap::new();
    for a in build_args {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--build-arg {a:?}: NAME=VALUE"))?;
        args.insert(k.to_owned(), v.to_owned());
    }
    let plan = dockerfile::parse(&text, &args)?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    let context = match context {
        Some(c) => c,
        None => file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| p.to_owned())
            .unwrap_or_else(|| ".".into()),
    };
    let client = g.client()?;
    let ignore = std::sync::Arc::new(crate::build_context::DockerIgnore::load(&context)?);
    let mut steps = Vec::new();
    for planned in plan.steps {
        let step = match planned {
            PlannedStep::Step(step) => step,
            PlannedStep::Copy {
                sources,
                dest,
                chown,
            } => {
                let (ctx, srcs, to, ignore) = (
                    context.clone(),
                    sources.clone(),
                    dest.clone(),
                    ignore.clone(),
                );
                let packed = tokio::task::spawn_blocking(move || {
                    crate::build_context::pack(&ctx, &srcs, &to, &ignore)
                })
                .await??;
                // An archive the server has (for this caller) is not sent again.
                let present = client.build_files(&packed.sha256).await?["present"] == true;
                if !present {
                    let body = tokio::fs::File::open(packed.file.path()).await?;
                    client.put_build_files(&packed.sha256, body).await?;
                }
                eprintln!(
                    "{} {} for COPY {} ({})",
                    if present {
                        "already uploaded:"
                    } else {
                        "uploaded"
                    },
                    sources.join(" "),
                    dest,
                    crate::render::short(&packed.sha256)
                );
                BuildStep::Copy(CopyStep {
                    files: packed.sha256,
                    dest: packed.dest_dir,
                    chown,
                })
            }
        };
        steps.push(step);
    }
    let mut req =
        serde_json::json!({"name": name, "from_image": plan.from, "steps": steps, "tags": tags});
    if let Some(user) = user {
        req["user"] = user.into();
    }
    Ok(req)
}

/// Adds the `start` of a build request from the command line's flags.
fn add_start(
    req: &mut serde_json::Value,
    command: Option<String>,
    ready: Option<String>,
    ready_timeout_secs: Option<u32>,
) {
    if let Some(command) = command {
        req["start"] = serde_json::json!({"command": command});
        if let Some(ready) = ready {
            req["start"]["ready"] = ready.into();
        }
        if let Some(secs) = ready_timeout_secs {
            req["start"]["ready_timeout_secs"] = secs.into();
        }
    }
}

/// Starts build `req` on the server and prints its log as it comes; registry credentials
/// from the auth file are sent for that pull only.
async fn follow_build(
    g: &Global,
    name: String,
    mut req: serde_json::Value,
    registry_auth: Option<std::path::PathBuf>,
) -> anyhow::Result<u8> {
    use futures::StreamExt;
    use space_core::template::TemplateBuildEvent;
    let from = req["from_image"].as_str().unwrap_or_default().to_owned();
    let stored = req.get("registry_credential").is_some();
    if let Some(file) = registry_auth.filter(|_| !from.is_empty() && !stored) {
        if let Some(login) = space_images::oci::registry::login_for_reference(&file, &from)? {
            req["registry_auth"] =
                serde_json::json!({"username": login.username, "password": login.password});
        }
    }
    let mut events = g.client()?.build_template_followed(&req).await?;
    while let Some(ev) = events.next().await {
        match ev? {
            TemplateBuildEvent::Started { build_id, .. } => eprintln!("build {build_id}"),
            TemplateBuildEvent::Log(line) => eprintln!("{}", line.line),
            TemplateBuildEvent::Ready { template } => {
                if g.json {
                    render::json(&template)?;
                } else {
                    println!(
                        "built template {} ({}, {} MiB)",
                        template.name,
                        render::short(&template.digest),
                        template.image_size_mib
                    );
                }
                return Ok(0);
            }
            TemplateBuildEvent::Failed { error } => {
                anyhow::bail!("the build failed: {} ({:?})", error.message, error.code)
            }
        }
    }
    anyhow::bail!("the server ended the build's stream early; see `space template get {name}`")
}

fn open_store(g: &Global) -> anyhow::Result<space_storage::Store> {
    let cfg = space_control::ServerConfig::new(&g.data_dir);
    Ok(space_storage::Store::open(
        &cfg.node.data_dir,
        cfg.node.loop_size_bytes,
    )?)
}

fn spinner() -> ProgressBar {
    let pb = if crate::term::stderr_is_tty() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}
