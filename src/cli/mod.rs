//! The command-line tools beside `serve`: `check` (config and policies, with
//! a per-role summary, and whether the shared stores answer), `migrate` (the
//! PostgreSQL approvals schema), `explain` (one decision and the rules behind
//! it) and `token mint` / `token inspect` for development; [`audit`] is
//! `mcp-firewall audit` (an auditor's questions), [`pins`] is `mcp-firewall
//! pins` (reviewing tool definitions from a terminal).

pub mod audit;
mod check;
pub mod credentials;
mod explain;
pub mod pins;
pub mod policy_test;
pub(crate) mod replay;
mod token;
pub use self::check::*;
pub use self::explain::*;
pub use self::token::*;
