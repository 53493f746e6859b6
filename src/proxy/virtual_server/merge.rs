//! Members' answers read as the virtual server needs them, and merged lists
//! written, without reading what it does not change: an item of a list
//! (a tool with its schemas) stays the member's bytes unless its name is
//! renamed (`prefix`) or its task id sealed, and only then is that one item
//! rewritten. (The member's path already read every byte strictly.)

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::mcp::jsonrpc::Id;

/// A member's JSON-RPC answer, its parts left unread.
#[derive(Deserialize)]
pub(crate) struct Reply<'a> {
    /// `result`.
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    /// `error`.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

/// Reads a member's answer (`None`: not a JSON-RPC answer).
pub(crate) fn reply(bytes: &[u8]) -> Option<Reply<'_>> {
    serde_json::from_slice(bytes).ok()
}

/// One item of a member's list page.
pub(crate) struct Item<'a> {
    /// The member's bytes.
    pub raw: &'a RawValue,
    /// Its name, or URI (normalized), as the names know it.
    pub name: Option<String>,
}

/// One member's page of a list: its result's fields (the items' array
/// among them, read as items).
pub(crate) struct Page<'a> {
    /// The member.
    pub member: usize,
    /// The result's members, unread.
    pub fields: BTreeMap<String, &'a RawValue>,
    /// The items of `key`.
    pub items: Vec<Item<'a>>,
}

/// The field an item of `key`'s list is known by.
pub(crate) fn name_field(key: &str) -> Option<&'static str> {
    match key {
        "tools" | "prompts" | "resourceTemplates" => Some("name"),
        "resources" => Some("uri"),
        _ => None,
    }
}

/// Reads `result` as a page of `key`'s list.
pub(crate) fn page<'a>(member: usize, result: &'a RawValue, key: &str) -> Option<Page<'a>> {
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        name: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        uri: Option<std::borrow::Cow<'a, str>>,
    }
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(result.get()).ok()?;
    let raw_items: Vec<&RawValue> = match fields.get(key) {
        Some(a) => serde_json::from_str(a.get()).ok()?,
        None => Vec::new(),
    };
    let field = name_field(key);
    let items = raw_items
        .into_iter()
        .map(|raw| {
            let name = field.and_then(|f| {
                let n: Named = serde_json::from_str(raw.get()).ok()?;
                if f == "uri" {
                    n.uri.map(|u| crate::upstream::members::normal_uri(&u))
                } else {
                    n.name.map(|n| n.into_owned())
                }
            });
            Item { raw, name }
        })
        .collect();
    Some(Page {
        member,
        fields,
        items,
    })
}

/// `item` with its member `field` set to `to` (the rest as the member
/// wrote it).
pub(crate) fn with_field(item: &RawValue, field: &str, to: &Value) -> Option<String> {
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(item.get()).ok()?;
    let mut out = String::with_capacity(item.get().len() + 16);
    out.push('{');
    let mut first = true;
    let mut put = |k: &str, v: &str| {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&Value::String(k.to_owned()).to_string());
        out.push(':');
        out.push_str(v);
    };
    let to = to.to_string();
    let mut set = false;
    for (k, v) in &members {
        if k == field {
            put(k, &to);
            set = true;
        } else {
            put(k, v.get());
        }
    }
    if !set {
        put(field, &to);
    }
    out.push('}');
    Some(out)
}

/// A JSON object from members whose values are JSON text already.
pub(crate) fn object<'a>(members: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(k.to_owned()).to_string());
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    out
}

/// A JSON array of JSON texts.
pub(crate) fn array<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (i, v) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(v);
    }
    out.push(']');
    out
}

/// The JSON-RPC response carrying `result` (JSON text) for `id`.
pub(crate) fn response(id: Option<&Id>, result: &str) -> String {
    let id = id.map_or_else(|| "null".to_owned(), |i| i.to_string());
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_keep_their_bytes_and_a_renamed_one_changes_only_its_name() {
        let result: Box<RawValue> = serde_json::from_str(
            r#"{"tools":[{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}},{"name":"b\u0021"}],"nextCursor":"c","resultType":"complete"}"#,
        )
        .unwrap();
        let p = page(2, &result, "tools").unwrap();
        assert_eq!(p.member, 2);
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.items[0].name.as_deref(), Some("a"));
        // Escapes are read as what they spell.
        assert_eq!(p.items[1].name.as_deref(), Some("b!"));
        assert_eq!(
            p.items[0].raw.get(),
            r#"{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}}"#
        );
        let renamed = with_field(p.items[0].raw, "name", &Value::String("m__a".into())).unwrap();
        let v: Value = serde_json::from_str(&renamed).unwrap();
        assert_eq!(v["name"], "m__a");
        assert_eq!(v["inputSchema"]["properties"]["x"]["type"], "string");
        assert_eq!(p.fields["resultType"].get(), r#""complete""#);
        let r = response(
            Some(&Id::Number(4)),
            &object([("tools", array(["1", "2"]).as_str())]),
        );
        let v: Value = serde_json::from_str(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"jsonrpc":"2.0","id":4,"result":{"tools":[1,2]}})
        );
    }

    #[test]
    fn resources_are_known_by_their_normalized_uri() {
        let result: Box<RawValue> =
            serde_json::from_str(r#"{"resources":[{"uri":"FILE:///a/./b","name":"b"}]}"#).unwrap();
        let p = page(0, &result, "resources").unwrap();
        assert_eq!(p.items[0].name.as_deref(), Some("file:///a/b"));
    }
}
