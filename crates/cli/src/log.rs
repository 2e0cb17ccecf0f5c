//! The command's lines on stderr, through the servers' one log sink (`compcache-log`: levels,
//! journald priorities, rate limits) under the name `compcache`.

pub use compcache_log::Level;

/// How the command's lines start.
pub const WHO: &str = "compcache";

pub fn error(msg: &str) {
    compcache_log::error(WHO, msg)
}

pub fn warning(msg: &str) {
    compcache_log::warning(WHO, msg)
}

pub fn info(msg: &str) {
    compcache_log::info(WHO, msg)
}

/// A line at `level` in the caller's own words (no level word added).
pub fn verbatim(level: Level, text: &str) {
    compcache_log::log_verbatim(level, WHO, text)
}
