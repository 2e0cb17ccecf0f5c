//! The one error type of the command: a message that says what is wrong and what to do,
//! printed as one line, and the exit code.

use std::fmt;

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
