//! The MCP methods a client may send, per protocol revision: the firewall
//! forwards nothing else.
//!
//! Methods are matched exactly (`Tools/Call`, `tools/call ` and every other
//! spelling are unknown), against the revision the request speaks:
//!
//! | method | 2025-03-26 / 06-18 | 2025-11-25 | 2026-07-28 |
//! |---|---|---|---|
//! | `initialize`, `ping`, `logging/setLevel`, `resources/subscribe`, `resources/unsubscribe` | ✓ | ✓ | – |
//! | `tools/list`, `tools/call`, `prompts/list`, `prompts/get`, `resources/list`, `resources/templates/list`, `resources/read`, `completion/complete` | ✓ | ✓ | ✓ |
//! | `tasks/get`, `tasks/cancel` | – | ✓ | ✓ (tasks extension) |
//! | `tasks/result`, `tasks/list` | – | ✓ | – |
//! | `tasks/update` | – | – | ✓ (tasks extension) |
//! | `server/discover`, `subscriptions/listen` | – | – | ✓ |
//! | notifications `initialized`, `progress`, `roots/list_changed` | ✓ | ✓ | – |
//! | notification `tasks/status` | – | ✓ | – |
//! | notification `cancelled` | ✓ | ✓ | ✓ |
//!
//! 2026-07-28 defines no client notification over streamable HTTP (closing
//! the response stream cancels); `notifications/cancelled` is still accepted
//! there because it is harmless and some clients send it. A request method
//! sent without an `id` is invalid (-32600): a notification-shaped
//! `tools/call` must never slip past the checks a call gets. Methods an
//! upstream adds can be allowed per upstream (`extra_methods`).

use super::version::ProtocolVersion;

/// Whether a method is a request (has an `id`, gets an answer) or a
/// notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Needs an `id`.
    Request,
    /// Has no `id`.
    Notification,
}

/// What the decision step does with a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `tools/call`: policy, arguments, gates, budgets.
    ToolCall,
    /// `prompts/get`: the prompt rules.
    Prompt,
    /// `resources/read|subscribe|unsubscribe`: the resource rules.
    Resource,
    /// `completion/complete`: the rules of the prompt or resource it completes.
    Completion,
    /// A list whose answer is filtered for the run.
    List(ListKind),
    /// `notifications/cancelled`: may withdraw a held call.
    Cancel,
    /// `tasks/*`: only the run's own tasks, by their sealed ids.
    Task(TaskMethod),
    /// `subscriptions/listen` (2026-07-28): the tasks it names are the run's
    /// own, by their sealed ids.
    Listen,
    /// Lifecycle and everything else the firewall lets through as it is.
    Pass,
}

/// Which `tasks/*` method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskMethod {
    /// `tasks/get`: the task (2026-07-28: with its outcome once done).
    Get,
    /// `tasks/result` (2025-11-25): the outcome of the task's call.
    Result,
    /// `tasks/list` (2025-11-25).
    List,
    /// `tasks/cancel`.
    Cancel,
    /// `tasks/update` (2026-07-28): answers to the task's input requests.
    Update,
}

/// Which list an answer filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// `tools/list`
    Tools,
    /// `prompts/list`
    Prompts,
    /// `resources/list`
    Resources,
    /// `resources/templates/list`
    ResourceTemplates,
}

/// One method of the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Method {
    /// Its name.
    pub name: &'static str,
    /// Request or notification.
    pub shape: Shape,
    /// What the decision does with it.
    pub class: Class,
    eras: u8,
}

const LEGACY: u8 = 0b0011; // 2025-03-26 (and 2025-06-18) and 2025-11-25
const ALL: u8 = 0b0111;
const E1125: u8 = 0b0010;
const E0728: u8 = 0b0100;

const fn m(name: &'static str, shape: Shape, class: Class, eras: u8) -> Method {
    Method {
        name,
        shape,
        class,
        eras,
    }
}

use Class::*;
use Shape::*;

/// Every client-to-server method of the revisions the firewall speaks.
pub(crate) const METHODS: &[Method] = &[
    m("initialize", Request, Pass, LEGACY),
    m("ping", Request, Pass, LEGACY),
    m("logging/setLevel", Request, Pass, LEGACY),
    m("server/discover", Request, Pass, E0728),
    m("subscriptions/listen", Request, Listen, E0728),
    m("tools/list", Request, List(ListKind::Tools), ALL),
    m("tools/call", Request, ToolCall, ALL),
    m("prompts/list", Request, List(ListKind::Prompts), ALL),
    m("prompts/get", Request, Prompt, ALL),
    m("resources/list", Request, List(ListKind::Resources), ALL),
    m(
        "resources/templates/list",
        Request,
        List(ListKind::ResourceTemplates),
        ALL,
    ),
    m("resources/read", Request, Resource, ALL),
    m("resources/subscribe", Request, Resource, LEGACY),
    m("resources/unsubscribe", Request, Resource, LEGACY),
    m("completion/complete", Request, Completion, ALL),
    m("tasks/get", Request, Task(TaskMethod::Get), E1125 | E0728),
    m(
        "tasks/cancel",
        Request,
        Task(TaskMethod::Cancel),
        E1125 | E0728,
    ),
    m("tasks/result", Request, Task(TaskMethod::Result), E1125),
    m("tasks/list", Request, Task(TaskMethod::List), E1125),
    m("tasks/update", Request, Task(TaskMethod::Update), E0728),
    m("notifications/initialized", Notification, Pass, LEGACY),
    m("notifications/progress", Notification, Pass, LEGACY),
    m(
        "notifications/roots/list_changed",
        Notification,
        Pass,
        LEGACY,
    ),
    m("notifications/tasks/status", Notification, Pass, E1125),
    m("notifications/cancelled", Notification, Cancel, ALL),
];

/// The era bit of a revision.
fn era(version: ProtocolVersion) -> u8 {
    if version >= ProtocolVersion::V2026_07_28 {
        E0728
    } else if version >= ProtocolVersion::V2025_11_25 {
        E1125
    } else {
        0b0001
    }
}

/// The method of that exact name in `version`, if there is one.
pub(crate) fn lookup(name: &str, version: ProtocolVersion) -> Option<&'static Method> {
    let era = era(version);
    METHODS.iter().find(|m| m.name == name && m.eras & era != 0)
}

/// The class of a method by name whatever the revision (for answers whose
/// request the firewall remembers by method name).
pub(crate) fn class_of(name: &str) -> Class {
    METHODS
        .iter()
        .find(|m| m.name == name)
        .map_or(Class::Pass, |m| m.class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_match_exactly() {
        let v = ProtocolVersion::V2025_11_25;
        assert!(lookup("tools/call", v).is_some());
        for bad in [
            "Tools/Call",
            "tools/call ",
            " tools/call",
            "tools/call\u{0}",
            "tools/",
        ] {
            assert!(lookup(bad, v).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn each_revision_has_its_own_methods() {
        let legacy = ProtocolVersion::V2025_03_26;
        let tasks = ProtocolVersion::V2025_11_25;
        let stateless = ProtocolVersion::V2026_07_28;
        assert!(lookup("initialize", legacy).is_some());
        assert!(lookup("initialize", stateless).is_none());
        assert!(lookup("server/discover", legacy).is_none());
        assert!(lookup("server/discover", stateless).is_some());
        assert!(lookup("tasks/result", legacy).is_none());
        assert!(lookup("tasks/result", tasks).is_some());
        assert!(lookup("tasks/result", stateless).is_none());
        assert!(lookup("tasks/update", stateless).is_some());
        assert!(lookup("notifications/initialized", stateless).is_none());
        assert_eq!(
            lookup("notifications/cancelled", stateless).map(|m| m.class),
            Some(Class::Cancel)
        );
        // Revisions before 2025-03-26 read as 2025-03-26.
        assert!(lookup("ping", ProtocolVersion::parse("2024-11-05")).is_some());
    }

    #[test]
    fn shapes_and_classes() {
        let v = ProtocolVersion::V2025_06_18;
        let call = lookup("tools/call", v).expect("known");
        assert_eq!((call.shape, call.class), (Shape::Request, Class::ToolCall));
        assert_eq!(
            lookup("notifications/progress", v).map(|m| m.shape),
            Some(Shape::Notification)
        );
        assert_eq!(class_of("tools/list"), Class::List(ListKind::Tools));
        assert_eq!(class_of("no/such"), Class::Pass);
    }
}
