//! Text tables as zramctl prints them: one header line, then one line per row, every column as
//! wide as its widest cell (a long socket path widens its column instead of pushing the rest
//! out of line), text left-aligned and numbers right-aligned, one space between columns, and
//! no trailing blanks.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Formats `rows` under `headers` (`headers` and every row have one cell per column);
/// `headers: None` prints no heading (`--noheadings`).
pub fn format(headers: Option<&[&str]>, align: &[Align], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = align.iter().map(|_| 0).collect();
    for cells in headers.map(|h| h.iter().map(|s| s.to_string()).collect::<Vec<_>>()).iter().chain(rows) {
        for (w, c) in width.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (c, (&w, &a))) in cells.iter().zip(width.iter().zip(align)).enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let pad = " ".repeat(w - c.chars().count());
            match a {
                Align::Left => {
                    out += c;
                    out += &pad;
                }
                Align::Right => {
                    out += &pad;
                    out += c;
                }
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = String::new();
    if let Some(h) = headers {
        out += &line(&h.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    }
    for r in rows {
        out += &line(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_widen_to_their_longest_cell() {
        let rows = vec![
            vec!["/run/compcache/a-rather-long-socket-name-for-a-device.sock".to_string(), "lz4".into(), "4G".into()],
            vec!["/dev/ublkb0".to_string(), "zstd".into(), "512M".into()],
        ];
        let t = format(Some(&["NAME", "ALGORITHM", "DISKSIZE"]), &[Align::Left, Align::Left, Align::Right], &rows);
        let lines: Vec<&str> = t.lines().collect();
        // Every column starts at the same offset on every line.
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "ALGORITHM"), col(lines[1], "lz4"));
        assert_eq!(col(lines[1], "lz4"), col(lines[2], "zstd"));
        // Right-aligned numbers end together.
        assert_eq!(lines[0].len(), lines[1].len());
        assert_eq!(lines[1].len(), lines[2].len());
        assert!(lines.iter().all(|l| !l.ends_with(' ')));
        let t = format(None, &[Align::Left], &[vec!["x".into()]]);
        assert_eq!(t, "x\n");
    }
}
