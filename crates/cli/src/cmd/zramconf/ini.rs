//! One configuration file's text, read by the rules of the INI parser zram-generator uses
//! (rust-ini with its default options), so that a file means here what it means to it:
//!
//! - `[name]` starts a section; lines before the first are the global section (where
//!   zram-generator takes `set!` directives); a section may appear twice, its keys then add up;
//! - `key = value` or `key: value` (the first `=` or `:` ends the key); key and value are
//!   trimmed; the same key twice: the later wins (the caller applies entries in order);
//! - a value may be quoted, `"..."` or `'...'` (the quotes are removed, the text after a
//!   closing quote continues the value), and takes backslash escapes (`\t`, `\n`, `\\`, `\"`,
//!   `\xHHHH`; `\` before any other character is that character); a `\` at the end of a line
//!   continues the value on the next line;
//! - lines starting with `#` or `;` are comments; there are no comments after a value (`ram #
//!   half` is the value `ram # half`, which then fails as an expression).
//!
//! Malformed lines are errors naming the file and line, as they make zram-generator's parser
//! fail for the whole file (it stops with "expecting `=`"): a line that is neither a section,
//! a comment nor `key = value`, a key that is empty, a section without `]` or with text after
//! it, a quote that is not closed. rust-ini would, in some of these cases, carry the broken line
//! into the next line's key instead of failing; compcache names the line instead.

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
    /// 1-based, for messages.
    pub line: usize,
}

/// One `[name]` header and the entries under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniSection {
    pub name: String,
    pub line: usize,
    pub entries: Vec<Entry>,
}

/// A parsed file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IniFile {
    /// The entries before the first section header.
    pub global: Vec<Entry>,
    pub sections: Vec<IniSection>,
}

/// Parses `text`; `origin` (the file's path) prefixes error messages.
pub fn parse(text: &str, origin: &str) -> Result<IniFile, String> {
    let mut file = IniFile::default();
    let lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    let mut n = 0;
    while n < lines.len() {
        let at = n + 1;
        let err = |what: String| format!("{origin}:{at}: {what}");
        let line = lines[n].trim();
        n += 1;
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let (name, after) = rest.split_once(']').ok_or_else(|| err(format!("`{line}`: a section header needs its `]`")))?;
            if !after.trim().is_empty() {
                return Err(err(format!("`{line}`: nothing may follow a section header (not even a comment)")));
            }
            file.sections.push(IniSection { name: name.trim().to_string(), line: at, entries: Vec::new() });
            continue;
        }
        let sep = line.find(['=', ':']).ok_or_else(|| {
            err(format!("`{line}` is not `key = value`, a `[section]` or a comment (zram-generator's parser rejects it too)"))
        })?;
        let key = line[..sep].trim();
        if key.is_empty() {
            return Err(err(format!("`{line}`: the key before `{}` is missing", &line[sep..sep + 1])));
        }
        // A value ending in an unescaped `\` continues on the next line.
        let mut raw = line[sep + 1..].to_string();
        while ends_in_continuation(&raw) && n < lines.len() {
            raw.pop();
            raw.push_str(lines[n]);
            n += 1;
        }
        let value = value(&raw).map_err(err)?;
        let entry = Entry { key: key.to_string(), value, line: at };
        match file.sections.last_mut() {
            Some(s) => s.entries.push(entry),
            None => file.global.push(entry),
        }
    }
    Ok(file)
}

fn ends_in_continuation(raw: &str) -> bool {
    raw.bytes().rev().take_while(|&b| b == b'\\').count() % 2 == 1
}

/// A value's text after the `=`: quoted parts unquoted, escapes resolved, unquoted text
/// trimmed.
fn value(raw: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = raw.trim_start();
    let mut first = true;
    while let Some(c) = rest.chars().next() {
        if c == '"' || c == '\'' {
            let inner = &rest[1..];
            let close = find_unescaped(inner, c).ok_or_else(|| format!("`{raw}`: the {c} is not closed"))?;
            out.push_str(&unescape(&inner[..close]));
            rest = &inner[close + 1..];
            first = false;
        } else {
            let text = unescape(rest);
            out.push_str(if first { text.trim() } else { text.trim_end() });
            break;
        }
    }
    Ok(out)
}

fn find_unescaped(s: &str, quote: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            c if c == quote => return Some(i),
            _ => {}
        }
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            None => out.push('\\'),
            Some('0') => out.push('\0'),
            Some('a') => out.push('\x07'),
            Some('b') => out.push('\x08'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('n') => out.push('\n'),
            Some('x') => {
                let hex: String = chars.clone().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).filter(|_| hex.len() == 4) {
                    Some(ch) => {
                        out.push(ch);
                        chars.nth(3);
                    }
                    None => out.push('x'),
                }
            }
            Some(other) => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(f: &IniFile, section: usize) -> Vec<(&str, &str)> {
        f.sections[section].entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect()
    }

    #[test]
    fn sections_keys_and_comments() {
        let f =
            parse("# c\n; c\nset!x = echo 1\n\n[ zram0 ]\nzram-size = ram / 2 \r\nswap-priority: 5\n[zram1]\n[zram0]\nzram-size=1\n", "t")
                .unwrap();
        assert_eq!(f.global, vec![Entry { key: "set!x".into(), value: "echo 1".into(), line: 3 }]);
        assert_eq!(f.sections.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["zram0", "zram1", "zram0"]);
        assert_eq!(kv(&f, 0), [("zram-size", "ram / 2"), ("swap-priority", "5")]);
        assert_eq!(kv(&f, 2), [("zram-size", "1")]);
        // The first `=` or `:` ends the key.
        let f = parse("[a]\nw = /dev/disk/by-id/x:y\nv: a=b\n", "t").unwrap();
        assert_eq!(kv(&f, 0), [("w", "/dev/disk/by-id/x:y"), ("v", "a=b")]);
    }

    #[test]
    fn quotes_escapes_and_continuations() {
        let f = parse("[a]\nq = \"  spaced \" tail \nr = 'it''s'\ne = a\\tb\\\\c\\x0041\nc = one \\\n  two\nk = \"a # b\"\n", "t").unwrap();
        assert_eq!(kv(&f, 0), [("q", "  spaced  tail"), ("r", "its"), ("e", "a\tb\\cA"), ("c", "one   two"), ("k", "a # b")]);
        assert!(parse("[a]\nq = \"open\n", "t").unwrap_err().contains("not closed"));
    }

    #[test]
    fn malformed_lines_name_the_file_and_line() {
        let e = parse("[zram0]\nzram-size = 1\njunk\n", "/etc/x.conf").unwrap_err();
        assert!(e.starts_with("/etc/x.conf:3: `junk`"), "{e}");
        assert!(parse("[zram0\n", "t").unwrap_err().contains("needs its `]`"));
        assert!(parse("[zram0] # c\n", "t").unwrap_err().contains("nothing may follow"));
        assert!(parse("[zram0]\n = 1\n", "t").unwrap_err().contains("key before `=` is missing"));
        // An inline `#` is part of the value, as in rust-ini.
        assert_eq!(kv(&parse("[a]\nk = ram # half\n", "t").unwrap(), 0), [("k", "ram # half")]);
    }
}
