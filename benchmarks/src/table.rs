//! A plain-text table in ucx-py's style: `key | value` rows between `---` and `===` rules.

/// One line of a [`Table`].
#[derive(Debug, Clone, PartialEq)]
enum Line {
    Text(String),
    Rule(char),
    Row(String, String),
}

/// A key/value table. Keys are padded to the widest key; rules span the widest line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    lines: Vec<Line>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A line of free text (a title).
    pub fn text(&mut self, text: impl Into<String>) -> &mut Self {
        self.lines.push(Line::Text(text.into()));
        self
    }

    /// A `-----` rule.
    pub fn rule(&mut self) -> &mut Self {
        self.lines.push(Line::Rule('-'));
        self
    }

    /// A `=====` rule.
    pub fn double_rule(&mut self) -> &mut Self {
        self.lines.push(Line::Rule('='));
        self
    }

    /// A `key | value` row.
    pub fn row(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.lines.push(Line::Row(key.into(), value.into()));
        self
    }

    /// The table as text, one line per entry, ending with a newline.
    pub fn render(&self) -> String {
        let key_width = self.lines.iter().filter_map(|l| if let Line::Row(k, _) = l { Some(width(k)) } else { None });
        let key_width = key_width.max().unwrap_or(0).max(11);
        let line_width = self
            .lines
            .iter()
            .map(|l| match l {
                Line::Text(t) => width(t),
                Line::Rule(_) => 0,
                Line::Row(_, v) => key_width + 3 + width(v),
            })
            .max()
            .unwrap_or(0)
            .max(26);
        let mut out = String::new();
        for line in &self.lines {
            match line {
                Line::Text(t) => out.push_str(t),
                Line::Rule(c) => out.extend(std::iter::repeat_n(*c, line_width)),
                Line::Row(k, v) => {
                    out.push_str(k);
                    out.extend(std::iter::repeat_n(' ', key_width - width(k)));
                    out.push_str(" | ");
                    out.push_str(v);
                }
            }
            out.push('\n');
        }
        out
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_and_rules_span_the_table() {
        let mut t = Table::new();
        t.text("Roundtrip benchmark").rule().row("n_iter", "10").row("a much longer key", "x").double_rule();
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Roundtrip benchmark");
        assert_eq!(lines[2], "n_iter            | 10");
        assert_eq!(lines[3], "a much longer key | x");
        assert!(lines[1].chars().all(|c| c == '-') && lines[1].len() >= 26);
        assert!(lines[4].chars().all(|c| c == '='));
    }
}
