//! The error type of the ublk front end.

use thiserror::Error;

/// Everything that can stop the ublk front end from creating or serving a device.
#[derive(Debug, Error)]
pub enum Error {
    /// The running kernel cannot host a ublk device (module missing, too old, no io_uring).
    /// The text says what was looked for.
    #[error("ublk is not available: {0}")]
    Unsupported(String),

    /// libublk (the control or an I/O ring) failed; carries libublk's own error, and the
    /// kernel's errno where libublk has one (its own text for it is only "io_uring IO
    /// failure").
    #[error("ublk control: {context}: {}", describe(.source))]
    Ublk {
        context: &'static str,
        #[source]
        source: libublk::UblkError,
    },

    /// The options cannot work (zero queues, depth over the driver's limit, ...).
    #[error("invalid ublk options: {0}")]
    Options(String),

    /// An OS call around the device failed (signal mask, swapoff on shutdown, ...).
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The errno that best describes this error, for callers that report to the kernel or
    /// exit with a status.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Ublk { source, .. } => ublk_errno(source),
            Error::Options(_) => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    pub(crate) fn ublk(context: &'static str) -> impl FnOnce(libublk::UblkError) -> Error {
        move |source| Error::Ublk { context, source }
    }
}

/// libublk's error, with the errno the kernel returned when it carries one.
fn describe(e: &libublk::UblkError) -> String {
    use libublk::UblkError as U;
    match e {
        U::UringIOError(r) | U::OtherError(r) if *r < 0 => format!("{e} ({})", std::io::Error::from_raw_os_error(-r)),
        _ => e.to_string(),
    }
}

/// libublk reports kernel errors as negative errno values in several variants.
fn ublk_errno(e: &libublk::UblkError) -> i32 {
    use libublk::UblkError as U;
    match e {
        U::UringIOError(r) | U::OtherError(r) => r.checked_abs().unwrap_or(libc::EIO),
        U::IOError(io) => io.raw_os_error().unwrap_or(libc::EIO),
        U::InvalidVal => libc::EINVAL,
        U::QueueIsDown => libc::ENODEV,
        U::UringTimeout => libc::ETIMEDOUT,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_error_says_its_errno() {
        let e = Error::Ublk { context: "START_USER_RECOVERY", source: libublk::UblkError::UringIOError(-libc::EINVAL) };
        let text = e.to_string();
        assert!(text.starts_with("ublk control: START_USER_RECOVERY: "), "{text}");
        assert!(text.contains("Invalid argument (os error 22)"), "{text}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
}
