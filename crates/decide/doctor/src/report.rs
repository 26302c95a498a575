//! The doctor's report for people: grouped by severity and category, coloured on a terminal.

use crate::finding::{Category, Finding, Severity};

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";

fn colour(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "\x1b[1;31m",
        Severity::Warning => "\x1b[1;33m",
        Severity::Info => "\x1b[1;36m",
    }
}

struct Style(bool);

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.0 {
            format!("{code}{text}{RESET}")
        } else {
            text.to_string()
        }
    }
}

/// Indents every line after the first by `pad`.
fn hang(text: &str, pad: &str) -> String {
    text.lines().collect::<Vec<_>>().join(&format!("\n{pad}"))
}

/// The report; `header` is printed first (what was read), `colour` adds ANSI colours.
pub fn render(findings: &[Finding], header: &str, colour_on: bool) -> String {
    let style = Style(colour_on);
    let mut out = String::new();
    if !header.is_empty() {
        out.push_str(&style.paint(DIM, header));
        out.push('\n');
    }
    let (c, w, i) = crate::counts(findings);
    if findings.is_empty() {
        out.push_str("No problems found.\n");
        return out;
    }
    out.push_str(&format!(
        "{} critical, {} warning{}, {} info\n",
        c,
        w,
        if w == 1 { "" } else { "s" },
        i
    ));
    for sev in [Severity::Critical, Severity::Warning, Severity::Info] {
        let group: Vec<&Finding> = findings.iter().filter(|f| f.severity == sev).collect();
        if group.is_empty() {
            continue;
        }
        out.push('\n');
        out.push_str(&style.paint(
            colour(sev),
            &format!("{} ({})", sev.as_str().to_uppercase(), group.len()),
        ));
        out.push('\n');
        let mut categories: Vec<Category> = group.iter().map(|f| f.category).collect();
        categories.dedup();
        for cat in categories {
            out.push_str(&format!("  [{}]\n", cat.as_str()));
            for f in group.iter().filter(|f| f.category == cat) {
                out.push_str(&format!(
                    "  {} {}  {}\n",
                    style.paint(colour(sev), "●"),
                    style.paint(BOLD, &f.title),
                    style.paint(DIM, &format!("({})", f.code))
                ));
                let pad = "              ";
                if !f.objects.is_empty() {
                    let objs: Vec<String> = f.objects.iter().map(ToString::to_string).collect();
                    out.push_str(&format!("      objects:  {}\n", objs.join(", ")));
                }
                for (k, e) in f.evidence.iter().enumerate() {
                    let label = if k == 0 { "evidence: " } else { "          " };
                    out.push_str(&format!("      {label}{}\n", hang(e, pad)));
                }
                if !f.fix.is_empty() {
                    out.push_str(&format!(
                        "      {}      {}\n",
                        style.paint(BOLD, "fix:"),
                        hang(&f.fix, pad)
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::ObjectRef;

    #[test]
    fn grouped_plain_and_coloured() {
        let findings = vec![
            Finding::new(
                Severity::Critical,
                Category::Scheduling,
                "untolerated-taint",
                "Pod a/b does not tolerate",
            )
            .object(ObjectRef::pod("a", "b"))
            .evidence("FailedScheduling: 0/1 nodes")
            .fix("add to the pod spec:\ntolerations:\n- key: x"),
            Finding::new(
                Severity::Info,
                Category::Cost,
                "idle-gpu-node",
                "Node n idle",
            )
            .object(ObjectRef::node("n")),
        ];
        let plain = render(&findings, "read 1 node", false);
        assert!(plain.contains("1 critical, 0 warnings, 1 info"));
        assert!(plain.contains(
            "CRITICAL (1)\n  [scheduling]\n  ● Pod a/b does not tolerate  (untolerated-taint)"
        ));
        assert!(plain.contains("      fix:      add to the pod spec:\n              tolerations:"));
        assert!(plain.contains("objects:  Pod a/b"));
        assert!(!plain.contains('\x1b'));
        assert!(render(&findings, "", true).contains("\x1b[1;31m"));
        assert_eq!(render(&[], "", false), "No problems found.\n");
    }
}
