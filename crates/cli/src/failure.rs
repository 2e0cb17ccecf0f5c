//! The one error type of the command: a message that says what is wrong and what to do,
//! printed as one line, and the exit code.

use std::fmt;

/// The exit code of `compcache swapon` when it set nothing up because zram-generator's rules
/// say so (in a container, `systemd.zram=0`): not 0, so that a script can tell "nothing was
/// set up" from "swap is on", and neither 1 nor 2, which are errors.
pub const STOOD_DOWN: i32 = 3;

/// The exit code of a FUSE server that handed its device over (`compcache restart`, SIGUSR2):
/// it stopped without taking anything down, for its supervisor to start the successor at once.
pub const HANDED_OVER: i32 = 75;

/// The exit code of a successor that cannot use the state it was handed (the store refuses it,
/// another layout, a descriptor missing): its supervisor keeps the descriptors and tries again
/// only after a pause that grows (docs/swap.md, "When the server dies").
pub const TAKEOVER_REFUSED: i32 = 78;

/// A failure with exit code `code` and a message.
pub fn with_code(code: i32, message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code }
}

#[derive(Debug)]
pub struct Failure {
    message: String,
    code: i32,
}

impl Failure {
    /// A failure with exit code 1.
    pub fn new(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), code: 1 }
    }

    /// A failure caused by how the command was invoked (exit code 2, as clap's own errors).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), code: 2 }
    }

    /// Not a failure but an outcome a script must be able to tell from success by the exit
    /// code alone (`swapon` standing down by zram-generator's rules: [`STOOD_DOWN`]); the
    /// command has printed what it has to say, so there is no message.
    pub fn status(code: i32) -> Failure {
        Failure { message: String::new(), code }
    }

    /// Whether there is a message to print (not for [`Failure::status`]).
    pub fn has_message(&self) -> bool {
        !self.message.is_empty()
    }

    pub fn exit_code(&self) -> i32 {
        self.code
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Lets `?` turn any error with a good message (the crates' errors) into a failure.
impl<E: std::error::Error> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.to_string())
    }
}
