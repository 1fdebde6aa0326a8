//! Plain-text tables: ucx-py's style of `key | value` rows between `---` and `===` rules
//! ([`Table`]), and rows of columns under a header ([`Columns`], the sweep's summary).

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

/// Rows of cells under a header: each column right-aligned to its widest cell, ` | `
/// between columns, a `-` rule under the header. A row with fewer cells than the header
/// leaves the last columns empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Columns {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Columns {
    /// An empty table with these column names.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self { header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Appends a row (cells beyond the header's columns are dropped).
    pub fn push(&mut self, row: Vec<String>) -> &mut Self {
        self.rows.push(row);
        self
    }

    /// The table as text, one line per row, ending with a newline.
    pub fn render(&self) -> String {
        fn cell(row: &[String], i: usize) -> &str {
            row.get(i).map_or("", String::as_str)
        }
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| std::iter::once(&self.header).chain(&self.rows).map(|r| width(cell(r, i))).max().unwrap_or(0))
            .collect();
        let line = |row: &[String]| {
            let cells: Vec<String> =
                widths.iter().enumerate().map(|(i, w)| format!("{:>w$}", cell(row, i), w = *w)).collect();
            cells.join(" | ") + "\n"
        };
        let mut out = line(&self.header);
        out.extend(std::iter::repeat_n('-', widths.iter().sum::<usize>() + 3 * widths.len().saturating_sub(1)));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

impl std::fmt::Display for Columns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
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

    #[test]
    fn columns_are_right_aligned_to_their_widest_cell() {
        let mut t = Columns::new(["size", "p99"]);
        t.push(vec!["8 B".into(), "12.50 us".into()]).push(vec!["1000.00 MB".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "      size |      p99");
        assert_eq!(lines[1], "-".repeat(21));
        assert_eq!(lines[2], "       8 B | 12.50 us");
        assert_eq!(lines[3], "1000.00 MB |         ");
        assert_eq!(lines.len(), 4);
    }
}
