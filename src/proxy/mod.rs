//! The proxy: what happens to a request on `/mcp/<upstream>` and to the
//! answer that comes back. [`path`] is the request path, every stage a
//! message passes in order, top to bottom in one file; the rest of this
//! folder is what those stages are made of:
//!
//! | module | owns |
//! |---|---|
//! | [`mod@path`] | the request path: route, browser checks, authenticate, authority, session, parse, decide, admit, record, hold, forward, relay |
//! | [`state`](State) | the shared state every request reads (`State`) |
//! | [`request`] | the request stages as types: parsed, decided, admitted, held |
//! | [`decision`] | the decision's vocabulary: the run's context, rulings, outcomes |
//! | [`outbound`] | the answer side: every byte toward the model through one gate |
//! | [`record`] | audit rows written before anything leaves |
//! | [`answer`], [`error`] | what the firewall itself answers, and its refusals |
//! | [`held_calls`] | calls waiting for a person |
//! | [`virtual_server`] | virtual servers: one endpoint over several upstreams |
//! | [`stack`] | the tower layers in front of [`handle`] |

pub(crate) mod answer;
pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod held_calls;
pub(crate) mod outbound;
pub(crate) mod path;
pub(crate) mod record;
pub(crate) mod request;
pub(crate) mod stack;
mod state;
pub(crate) mod virtual_server;
pub(crate) use self::path::*;
pub(crate) use self::state::*;
