//! What the exchange owes an end to ([`Due`]): each forwarded request
//! waiting for its answer, each notification or response the upstream
//! must accept, or the GET stream or DELETE itself, with its budget, its
//! approval and its intent row.

use std::sync::Arc;

use http::Method;

use crate::audit::AuditRow;
use crate::budget::Reservation;
use crate::mcp::jsonrpc::{Id, Kind, Message};
use crate::mcp::methods::Class;
use crate::proxy::decision::Granted;

/// Something forwarded whose end the exchange records: a request waiting for
/// its answer, a notification or response the upstream must accept, or the
/// GET stream / DELETE itself.
#[derive(Debug)]
pub(crate) struct Due {
    /// The request id (`None`: nothing to answer).
    pub id: Option<Id>,
    /// Its method (`GET` / `DELETE` for transport rows).
    pub method: String,
    /// What its answer needs.
    pub class: Class,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// The budget reserved for it, settled when its answer (or failure) comes.
    pub reservation: Option<Reservation>,
    /// The approval it runs under.
    pub granted: Option<Arc<Granted>>,
    /// Its intent row, completed when it ends (`None` when audit is off).
    pub row: Option<AuditRow>,
    /// Learned from a sealed event id: its answer is replayed on a resumed
    /// stream (its budget and intent were settled on the original stream).
    pub resumed: bool,
    /// The run's own task a `tasks/*` request names.
    pub task: Option<crate::tasks::TaskRef>,
}

impl Due {
    /// A forwarded message: a request (with an id) waiting for its answer,
    /// or a notification or response.
    pub(crate) fn message(
        msg: &Message,
        class: Class,
        reservation: Option<Reservation>,
        granted: Option<Arc<Granted>>,
        row: Option<AuditRow>,
    ) -> Due {
        Due {
            id: (msg.kind == Kind::Request)
                .then(|| msg.id.clone())
                .flatten(),
            method: msg.method.clone().unwrap_or_default(),
            class,
            tool: msg.call.as_ref().map(|c| c.name.clone()),
            reservation,
            granted,
            row,
            resumed: false,
            task: None,
        }
    }

    /// The GET stream or DELETE itself.
    pub(crate) fn transport(method: &Method, row: Option<AuditRow>) -> Due {
        Due {
            id: None,
            method: method.as_str().to_owned(),
            class: Class::Pass,
            tool: None,
            reservation: None,
            granted: None,
            row,
            resumed: false,
            task: None,
        }
    }

    /// A request still due on a resumed stream, from its sealed event id.
    pub(crate) fn resumed(id: Id, method: String) -> Due {
        Due {
            id: Some(id),
            class: crate::mcp::methods::class_of(&method),
            tool: None,
            method,
            reservation: None,
            granted: None,
            row: None,
            resumed: true,
            task: None,
        }
    }
}
