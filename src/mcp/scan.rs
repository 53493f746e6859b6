//! Reading the facts of a JSON-RPC answer as it streams past, for answers
//! too large to hold whole (`max_response_bytes`): which request each
//! message answers, whether it is an error or a failed tool result, whether
//! it asks the client for input (2026-07-28 input-required results) and
//! what cost the upstream reported. The bytes pass on unchanged; what they
//! say is known at the end, before the last chunk is let go.
//!
//! At the message and `result` levels, keys that repeat or imitate a known
//! member in another letter case are refused, as for answers read whole.
//! The push parser is `actson`'s: bounded memory whatever the size.

use actson::feeder::PushJsonFeeder;
use actson::{JsonEvent, JsonParser};

use super::jsonrpc::Id;

/// What one message of the answer said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// The id it answers.
    pub id: Option<Id>,
    /// It carries `error`.
    pub error: bool,
    /// `result.isError`.
    pub is_error: bool,
    /// `result.resultType`.
    pub result_type: Option<String>,
    /// The `method` of each `result.inputRequests` entry.
    pub input_methods: Vec<String>,
    /// `result._meta[<cost key>]`.
    pub cost: Option<f64>,
}

/// One open container.
struct Frame {
    object: bool,
    /// The last member name read (objects).
    key: Option<String>,
    /// Folded keys seen at a checked level.
    seen: Vec<String>,
}

/// A streaming scanner of one JSON-RPC answer (a message or a batch).
pub struct Scan {
    parser: JsonParser<PushJsonFeeder>,
    stack: Vec<Frame>,
    batch: Option<bool>,
    current: Facts,
    facts: Vec<Facts>,
    cost_key: String,
    bytes: usize,
}

const MESSAGE_MEMBERS: &[&str] = &["jsonrpc", "id", "result", "error"];
const RESULT_MEMBERS: &[&str] = &[
    "isError",
    "resultType",
    "inputRequests",
    "requestState",
    "_meta",
    "content",
    "structuredContent",
    "tools",
    "contents",
    "messages",
];

impl Scan {
    /// A scanner reading the reported cost under `cost_key` of `_meta`.
    pub fn new(cost_key: &str) -> Scan {
        Scan {
            parser: JsonParser::new(PushJsonFeeder::new()),
            stack: Vec::new(),
            batch: None,
            current: Facts::default(),
            facts: Vec::new(),
            cost_key: cost_key.to_owned(),
            bytes: 0,
        }
    }

    /// Bytes scanned so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Scans the next bytes of the answer.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<(), String> {
        self.bytes += chunk.len();
        while !chunk.is_empty() {
            let n = self.parser.feeder.push_bytes(chunk);
            chunk = &chunk[n..];
            self.drain()?;
        }
        Ok(())
    }

    /// Ends the answer; the facts of each message, in order.
    pub fn finish(mut self) -> Result<Vec<Facts>, String> {
        self.parser.feeder.done();
        self.drain()?;
        if !self.stack.is_empty() || self.batch.is_none() {
            return Err("the answer ended inside a JSON value".to_owned());
        }
        Ok(self.facts)
    }

    fn drain(&mut self) -> Result<(), String> {
        loop {
            let event = self
                .parser
                .next_event()
                .map_err(|e| format!("invalid JSON in the answer: {e}"))?;
            match event {
                None | Some(JsonEvent::NeedMoreInput) => return Ok(()),
                Some(e) => self.on(e)?,
            }
        }
    }

    /// Depth of message objects: 1 for a single message, 2 in a batch.
    fn message_depth(&self) -> usize {
        if self.batch == Some(true) {
            2
        } else {
            1
        }
    }

    /// Member names from the message object down to the current value.
    fn path(&self) -> Vec<&str> {
        self.stack
            .iter()
            .skip(self.message_depth().saturating_sub(1))
            .map(|f| f.key.as_deref().unwrap_or(""))
            .collect()
    }

    fn on(&mut self, event: JsonEvent) -> Result<(), String> {
        match event {
            JsonEvent::StartObject | JsonEvent::StartArray => {
                let object = event == JsonEvent::StartObject;
                if self.batch.is_none() {
                    self.batch = Some(!object);
                }
                if object && self.stack.len() + 1 == self.message_depth() {
                    self.current = Facts::default();
                }
                if self.stack.len() + 1 > self.message_depth() {
                    self.value_at(None)?;
                }
                self.stack.push(Frame {
                    object,
                    key: None,
                    seen: Vec::new(),
                });
            }
            JsonEvent::EndObject | JsonEvent::EndArray => {
                self.stack.pop();
                if event == JsonEvent::EndObject && self.stack.len() + 1 == self.message_depth() {
                    self.facts.push(std::mem::take(&mut self.current));
                }
            }
            JsonEvent::FieldName => {
                let key = self
                    .parser
                    .current_str()
                    .map_err(|e| e.to_string())?
                    .to_owned();
                self.check_key(&key)?;
                if let Some(top) = self.stack.last_mut() {
                    top.key = Some(key);
                }
            }
            JsonEvent::ValueString => {
                let v = self
                    .parser
                    .current_str()
                    .map_err(|e| e.to_string())?
                    .to_owned();
                self.value_at(Some(Scalar::Str(v)))?;
            }
            JsonEvent::ValueInt => {
                let text = self
                    .parser
                    .current_str()
                    .map_err(|e| e.to_string())?
                    .to_owned();
                self.value_at(Some(Scalar::Num(text)))?;
            }
            JsonEvent::ValueFloat => {
                let text = self
                    .parser
                    .current_str()
                    .map_err(|e| e.to_string())?
                    .to_owned();
                self.value_at(Some(Scalar::Num(text)))?;
            }
            JsonEvent::ValueTrue => self.value_at(Some(Scalar::Bool(true)))?,
            JsonEvent::ValueFalse => self.value_at(Some(Scalar::Bool(false)))?,
            JsonEvent::ValueNull => self.value_at(Some(Scalar::Null))?,
            JsonEvent::NeedMoreInput => {}
        }
        Ok(())
    }

    /// Refuses repeated or case-imitating keys at the message and result levels.
    fn check_key(&mut self, key: &str) -> Result<(), String> {
        let depth = self.stack.len();
        let md = self.message_depth();
        let known = if depth == md {
            MESSAGE_MEMBERS
        } else if depth == md + 1
            && self.stack.get(depth - 2).and_then(|f| f.key.as_deref()) == Some("result")
        {
            RESULT_MEMBERS
        } else {
            return Ok(());
        };
        let folded = key.to_lowercase().replace('\u{17F}', "s");
        if let Some(m) = known
            .iter()
            .find(|m| m.to_ascii_lowercase() == folded && **m != key)
        {
            return Err(format!("the answer has a member {key:?} imitating {m:?}"));
        }
        let Some(top) = self.stack.last_mut() else {
            return Ok(());
        };
        if top.seen.contains(&folded) {
            return Err(format!("the answer repeats the member {key:?}"));
        }
        top.seen.push(folded);
        Ok(())
    }

    /// A value (scalar, or a container when `None`) at the current path.
    fn value_at(&mut self, scalar: Option<Scalar>) -> Result<(), String> {
        if !self.stack.last().is_some_and(|f| f.object) {
            return Ok(());
        }
        let path = self.path();
        let cost_key = self.cost_key.as_str();
        match (path.as_slice(), scalar) {
            (["id"], Some(Scalar::Num(n))) => {
                self.current.id = n.parse().ok().map(Id::Number);
            }
            (["id"], Some(Scalar::Str(s))) => self.current.id = Some(Id::String(s)),
            (["error"], _) => self.current.error = true,
            (["result", "isError"], Some(Scalar::Bool(b))) => self.current.is_error = b,
            (["result", "resultType"], Some(Scalar::Str(s))) => {
                self.current.result_type = Some(s);
            }
            (["result", "inputRequests", _, "method"], Some(Scalar::Str(s))) => {
                self.current.input_methods.push(s);
            }
            (["result", "_meta", k], Some(Scalar::Num(n))) if *k == cost_key => {
                self.current.cost = n.parse().ok();
            }
            _ => {}
        }
        Ok(())
    }
}

enum Scalar {
    Str(String),
    Num(String),
    Bool(bool),
    Null,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, chunk: usize) -> Result<Vec<Facts>, String> {
        let mut s = Scan::new("mcp-firewall/cost");
        for c in text.as_bytes().chunks(chunk.max(1)) {
            s.push(c)?;
        }
        s.finish()
    }

    #[test]
    fn facts_of_a_tool_result_are_read_whatever_the_chunking() {
        let big = "x".repeat(5000);
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{big}"}}],"isError":true,"_meta":{{"mcp-firewall/cost":2.5}}}}}}"#
        );
        for chunk in [1, 7, 1000, 100_000] {
            let facts = scan(&text, chunk).expect("scans");
            assert_eq!(
                facts,
                vec![Facts {
                    id: Some(Id::Number(7)),
                    is_error: true,
                    cost: Some(2.5),
                    ..Facts::default()
                }],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn input_requests_and_batches_are_seen() {
        let text = r#"[{"jsonrpc":"2.0","id":"a","result":{"resultType":"input_required","inputRequests":{"x":{"method":"sampling/createMessage","params":{}},"y":{"method":"roots/list"}}}},{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"m"}}]"#;
        let facts = scan(text, 3).expect("scans");
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[0].id, Some(Id::String("a".into())));
        assert_eq!(facts[0].result_type.as_deref(), Some("input_required"));
        assert_eq!(
            facts[0].input_methods,
            vec!["sampling/createMessage".to_owned(), "roots/list".to_owned()]
        );
        assert!(facts[1].error);
    }

    #[test]
    fn case_twins_and_broken_json_are_refused() {
        assert!(scan(
            r#"{"jsonrpc":"2.0","id":1,"result":{"isError":false,"IsError":true}}"#,
            4
        )
        .is_err());
        assert!(scan(r#"{"jsonrpc":"2.0","id":1,"Result":{}}"#, 4).is_err());
        assert!(scan(r#"{"jsonrpc":"2.0","id":1,"result":{"a":"#, 4).is_err());
        // The same name deeper down is the tool's own business.
        assert!(scan(
            r#"{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"isError":1,"IsError":2}}}"#,
            4
        )
        .is_ok());
    }
}
