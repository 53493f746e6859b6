//! The stages of a client's request between its parse and its forwarding,
//! in the order [`crate::proxy`]'s request path runs them: each a type of
//! its own ([`stage`]), a decision per message without I/O ([`decide`]),
//! admission against the approval, label and budget stores ([`admit`]),
//! the request's side of human approvals ([`approval_flow`]) and the hold
//! of a gated call until a person decides ([`hold`]). What they decide in
//! is [`crate::proxy::decision`]; what they write on record is
//! [`crate::proxy::record`]; the answer side is [`crate::proxy::outbound`].

pub(crate) mod admit;
pub(crate) mod approval_flow;
pub(crate) mod decide;
pub(crate) mod hold;
pub(crate) mod stage;
