//! `boxdesk cowork doctor`: will the Claude Desktop app start its Cowork
//! helper here at all, and what does boxdesk serve it on.
//!
//! The app's gate is `boxdesk_cowork::app::gate`'s, evaluated item by item
//! as the app does; where boxdesk is installed is `app::install`'s
//! status; what boxdesk runs on is the binary's own decision (cowork's
//! backend, and whether bubblewrap works here for this user). This module
//! owns the report, in words or JSON, and changes nothing (the one thing
//! it runs is the throw-away bwrap sandbox `boxdesk doctor` runs too).

use std::path::Path;

use boxdesk_cowork::app::{gate, install, layout};
use boxdesk_platform::probe;
use serde_json::{json, Value};

/// What boxdesk serves cowork on here, and whether it can.
struct Runs {
    backend: Option<&'static str>,
    why: String,
    can_run: bool,
    checks: Vec<(&'static str, String)>,
}

fn runs_on() -> Runs {
    let choice = match super::cowork_backend() {
        Ok(c) => c,
        Err(e) => {
            return Runs {
                backend: None,
                why: format!("`boxdesk cowork` refuses to start: {e:#}"),
                can_run: false,
                checks: Vec::new(),
            }
        }
    };
    let backend = choice.starter.backend();
    if backend != "namespace" {
        return Runs {
            backend: Some(backend),
            why: format!(
                "{}: each profile runs in a microVM whose root is this system, read-only, \
                 folders shared over virtio-fs, the network only through boxdesk's proxy",
                choice.why
            ),
            can_run: true,
            // cowork's own namespace for attached folders needs them too.
            checks: crate::cli::doctor::userns_checks(),
        };
    }
    let bwrap = probe::bwrap();
    let trial = if bwrap.is_available() {
        crate::cli::doctor::trial_sandbox()
    } else {
        probe::Probe::Missing {
            why: "not tried: bwrap is missing".into(),
            hint: None,
        }
    };
    Runs {
        backend: Some("namespace"),
        why: format!("{}: bubblewrap namespaces", choice.why),
        can_run: bwrap.is_available() && trial.is_available(),
        checks: std::iter::once(("bubblewrap", bwrap.to_string()))
            .chain(crate::cli::doctor::userns_checks())
            .chain([("trial sandbox", trial.to_string())])
            .collect(),
    }
}

/// `boxdesk cowork doctor [--app DIR] [--json] [--root DIR]`: exit 0 when
/// the app will start a helper and boxdesk can serve it here, else 1.
pub fn doctor(app: Option<&Path>, json_out: bool, root: Option<&Path>) -> anyhow::Result<i32> {
    let boxdesk = super::install::this_boxdesk()?;
    let found = layout::find(app);
    let status = found.as_ref().ok().map(|a| install::status(a, &boxdesk));
    let probe = gate::Probe {
        root: root.map_or_else(|| "/".into(), Path::to_owned),
        resources: found.as_ref().ok().map(|a| a.resources.clone()),
        ..gate::Probe::default()
    };
    let g = gate::evaluate(&probe);
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let bypass = gate::bypass(home.as_deref());
    let dials = g.passes() || bypass.is_some();
    let runs = runs_on();
    let code = i32::from(!(dials && runs.can_run));

    if json_out {
        let app_json = match (&found, &status) {
            (Ok(_), Some(Ok(st))) => serde_json::to_value(st)?,
            (Ok(a), Some(Err(e))) => {
                json!({"resources": a.resources, "kind": a.kind, "error": e.to_string()})
            }
            (Err(e), _) => json!({"error": e.to_string()}),
            (Ok(a), None) => json!({"resources": a.resources, "kind": a.kind}),
        };
        let report = json!({
            "app": app_json,
            "gate": {"arch": g.arch, "passes": g.passes(), "items": g.items},
            "bypass": bypass.as_ref().map(|(at, node)| json!({"where": at, "node_path": node})),
            "dials_helper": dials,
            "boxdesk": {
                "backend": runs.backend,
                "why": runs.why,
                "can_run": runs.can_run,
                "checks": runs.checks.iter().map(|(k, v)| (k.to_string(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(code);
    }

    match (&found, &status) {
        (Ok(a), Some(Ok(st))) => {
            println!("app: {} ({})", a.resources.display(), a.kind);
            for line in super::install::describe(st) {
                println!("  {line}");
            }
        }
        (Ok(a), Some(Err(e))) => println!("app: {} ({}): {e}", a.resources.display(), a.kind),
        (Err(e), _) => println!("app: {e}"),
        (Ok(a), None) => println!("app: {}", a.resources.display()),
    }
    println!(
        "the app's Cowork gate ({}), item by item as the app evaluates it{}:",
        g.arch,
        root.map_or(String::new(), |r| format!(" under {}", r.display()))
    );
    for item in &g.items {
        let mark = if item.ok { "ok  " } else { "FAIL" };
        println!("  {mark} {:<12} {}", item.name, item.detail);
        if !item.ok {
            println!("       {:<12} probed: {}", "", item.probed.join(", "));
        }
        if let Some(fix) = &item.fix {
            println!("       {:<12} fix: {fix}", "");
        }
    }
    match (&bypass, g.passes()) {
        (Some((at, node)), _) => {
            println!("the gate is skipped ({at}): the app starts `$COWORK_NODE_PATH <resources>/cowork-vm-service.js -socket PATH` instead of its helper");
            match node {
                Some(n) if Path::new(n).file_name().is_some_and(|f| f == super::HELPER_NAME) => {
                    println!("  COWORK_NODE_PATH={n}: boxdesk under the helper's name, so the app starts boxdesk")
                }
                Some(n) => println!("  COWORK_NODE_PATH={n}: to have it start boxdesk, make it a link named {} to boxdesk", super::HELPER_NAME),
                None => println!("  COWORK_NODE_PATH is not set: to have it start boxdesk, set it to a link named {} to boxdesk", super::HELPER_NAME),
            }
        }
        (None, true) => println!("the app will start its helper: every item passes"),
        (None, false) => println!(
            "the app will NOT start any helper here: it reports Cowork unsupported (\"Cowork requires QEMU\") until every item above is ok; boxdesk itself needs none of them"
        ),
    }
    match runs.backend {
        Some(b) => println!(
            "boxdesk: serves it on the {b} backend ({}): {}",
            if runs.can_run {
                "can run here"
            } else {
                "CANNOT run here"
            },
            runs.why
        ),
        None => println!("boxdesk: {}", runs.why),
    }
    for (k, v) in &runs.checks {
        println!("  {k}: {v}");
    }
    Ok(code)
}
