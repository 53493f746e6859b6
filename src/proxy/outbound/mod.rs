//! The answer side: what the upstream sends toward the client, decided
//! and carried out. [`gate`] is the one place every message passes before
//! any byte of it leaves (screening and the run's labels); the relay
//! ([`super::relay`]) carries bytes and the gate's verdicts.

pub mod gate;
