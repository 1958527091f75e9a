//! The committed OpenAPI description (`docs/openapi.json`) must be what the code generates:
//! a change to a request, a response or a route shows up in review as a change to that file.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tlaloc_server::{AppState, ServerConfig, router};
use tower::ServiceExt;

use crate::fake::{model_text, workspace};

/// The lines that differ between `old` and `new` as diff hunks (`-` old, `+` new, with a few
/// lines of context and `@@ -old +new @@` line numbers), cut to `max_lines` lines. Lines are
/// matched by a longest common subsequence, which is plenty for a file of a few thousand lines.
fn line_diff(old: &str, new: &str, max_lines: usize) -> String {
    const CONTEXT: usize = 3;
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let (n, m) = (a.len(), b.len());
    // common[i][j]: the longest common subsequence of a[i..] and b[j..].
    let at = |i: usize, j: usize| i * (m + 1) + j;
    let mut common = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            common[at(i, j)] = if a[i] == b[j] {
                common[at(i + 1, j + 1)] + 1
            } else {
                common[at(i + 1, j)].max(common[at(i, j + 1)])
            };
        }
    }
    // (mark, line, old line number, new line number), both numbers 1-based.
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i], i + 1, j + 1));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || common[at(i + 1, j)] >= common[at(i, j + 1)]) {
            ops.push(('-', a[i], i + 1, j + 1));
            i += 1;
        } else {
            ops.push(('+', b[j], i + 1, j + 1));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let shown = |k: usize| {
        changed
            .iter()
            .any(|&c| k + CONTEXT >= c && k <= c + CONTEXT)
    };
    let mut out = Vec::new();
    let mut in_hunk = false;
    for (k, &(mark, line, old_no, new_no)) in ops.iter().enumerate() {
        if !shown(k) {
            in_hunk = false;
            continue;
        }
        if !in_hunk {
            out.push(format!("@@ -{old_no} +{new_no} @@"));
            in_hunk = true;
        }
        out.push(format!("{mark}{line}"));
    }
    if out.len() > max_lines {
        let cut = out.len() - max_lines;
        out.truncate(max_lines);
        out.push(format!("... ({cut} more lines)"));
    }
    out.join("\n")
}

#[test]
fn the_committed_openapi_description_is_what_the_code_generates() {
    let path = workspace().join("docs/openapi.json");
    let generated = tlaloc_server::openapi_json();
    if std::env::var_os("TLALOC_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json differs from the description the code generates \
         (- committed, + generated):\n{}\n\nIf the change is meant, rewrite the file with \
         `TLALOC_BLESS=1 cargo test -p tlaloc-server --test all openapi` and commit it.",
        line_diff(&committed, &generated, 80)
    );
}

/// The server serves the same description, without an API key and before the model loads.
#[tokio::test]
async fn the_server_serves_its_description_at_openapi_json() {
    let mut config = ServerConfig::new("tiny");
    config.api_key = Some("s3cret".into());
    let app = router(AppState::new(config, model_text()));
    let request = Request::get("/openapi.json").body(Body::empty()).unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let served: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let generated: serde_json::Value =
        serde_json::from_str(&tlaloc_server::openapi_json()).unwrap();
    assert_eq!(served, generated);
    assert!(served["paths"]["/v1/chat/completions"]["post"].is_object());
}

#[test]
fn a_line_diff_shows_each_change_between_context_lines() {
    let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n";
    let new = "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nl\nm\n";
    assert_eq!(
        line_diff(old, new, 80),
        "@@ -1 +1 @@\n a\n-b\n+B\n c\n d\n e\n@@ -8 +8 @@\n h\n i\n j\n-k\n l\n+m"
    );
    assert_eq!(line_diff("", "x\n", 80), "@@ -1 +1 @@\n+x");
    assert_eq!(line_diff(old, old, 80), "");
    assert!(line_diff(old, "", 3).ends_with("... (10 more lines)"));
}
