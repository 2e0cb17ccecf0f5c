//! # compcache-nbd
//!
//! The NBD front end of compcache (work in progress).
