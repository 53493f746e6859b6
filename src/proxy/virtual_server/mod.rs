//! A virtual server (`[[virtual_server]]`, `/mcp/<name>`): several member
//! upstreams behind one endpoint. Each client message goes to the member
//! that owns its name, URI or id, **on that member's own request path**
//! (steps 4 on of [`super::path`]: authority, session, strict parse, decision,
//! gates, budgets, record, relay, screening): a virtual-server tool is
//! decided exactly as the member's tool is, rows name the member upstream
//! and the member's own tool name, plus the virtual server (`via`).
//!
//! What is this module's own:
//! - **Names** ([`index`](crate::upstream::members::Index)): resolved over
//!   the members' full lists, before any principal's filtering; a name no
//!   member exposes (unknown, or left out by the collision rule) reaches
//!   nothing.
//! - **Sessions**: one client session (a sealed `Mcp-Session-Id` bound to
//!   the principal and run) holds one session per member, opened by
//!   `initialize` for every member in parallel (within `list_timeout_ms`),
//!   and lazily for a member that was down; a member that cannot be opened
//!   is left out, not fatal. 2026-07-28 requests have no sessions.
//! - **Lists**: the four lists (and `tasks/list`) asked of every member in
//!   parallel, each within the deadline; a late member's items are missing
//!   from that page and asked again on the next (one sealed cursor holds
//!   every member's place).
//! - **Ids** ([`rewrite`]): a member's requests to the client, its task ids
//!   and the client's progress tokens are sealed per member; an answer, a
//!   task call or a progress report reaches only the member it is for.
//! - **Streams**: a member's event stream (an answer's, the GET stream) is
//!   relayed event by event with those rewrites; the GET stream is the
//!   members' streams merged. `list_changed` of a member is the virtual
//!   server's (and re-lists the member's names).
//!
//! Where each is: this file has the virtual server and one request's flow
//! (`serve`, then a POST's message read and sent on by its kind and
//! method); `route.rs` finds the member a request names; `member.rs`
//! sends one message to one member's path (its session opened when
//! needed) and relays the answer; `session.rs` keeps the client sessions;
//! `handshake.rs` answers `initialize` and `server/discover`; `fan_out.rs`
//! asks every member at once; `lists.rs` merges lists; `streams.rs`
//! relays and merges event streams; `reply.rs` writes the virtual
//! server's own answers; `merge.rs` and `rewrite.rs` read members' answers
//! and rewrite ids.

mod fan_out;
mod handshake;
mod lists;
mod member;
pub(crate) mod merge;
mod reply;
pub(crate) mod rewrite;
mod route;
mod serve;
mod session;
mod streams;
pub(crate) use self::serve::*;
