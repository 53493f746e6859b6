//! Reading the facts of a JSON-RPC answer as it streams past, for answers
//! too large to hold whole (`max_response_bytes`): which request each
//! message answers, whether it is an error or a failed tool result, whether
//! it asks the client for input (2026-07-28 input-required results) and
//! what cost the upstream reported. The bytes pass on unchanged; what they
//! say is known at the end, before the last chunk is let go.
//!
//! It refuses what the whole-answer reader ([`super::jsonrpc`]) refuses at
//! the levels decisions read, with the same member lists and the same key
//! comparison: keys that repeat or imitate a known member in another letter
//! case in a message, its `result` and its input requests; numbers
//! `serde_json` cannot hold (and reads the cost as it does); nesting past
//! its limit; a body that is no message or batch of messages; input
//! requests the held decision could not read. Deeper keys are the tool's
//! own business, as they are to the decisions. Its agreement with the other
//! readers is checked by `super::jsonrpc::differential` (tests, fuzzing).
//!
//! The push parser is `actson`'s: bounded memory whatever the size.

use actson::feeder::PushJsonFeeder;
use actson::{JsonEvent, JsonParser};

use super::jsonrpc::{Id, MESSAGE_MEMBERS, RESULT_MEMBERS};
use super::tape::Folded;

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
    /// Keys seen at a checked level.
    seen: Vec<String>,
    /// An input request's `method` string was read (`result.inputRequests.*`).
    method: bool,
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
    escapes: Escapes,
}

/// The `\u` escapes of the strings in the answer, followed byte by byte:
/// `actson` lets a lone surrogate through (as the escape's own text), which
/// the whole-answer reader and a client's decoder refuse or read otherwise.
#[derive(Default)]
struct Escapes {
    in_string: bool,
    /// After a backslash.
    escape: bool,
    /// Hex digits of a `\u` escape read so far, and their value.
    hex: Option<(u8, u32)>,
    /// A high surrogate waits for its low half (the very next escape).
    high: bool,
}

impl Escapes {
    fn push(&mut self, chunk: &[u8]) -> Result<(), String> {
        const LONE: &str = "the answer has a lone surrogate escape";
        for &b in chunk {
            if !self.in_string {
                self.in_string = b == b'"';
                continue;
            }
            if let Some((n, v)) = self.hex {
                let digit = char::from(b).to_digit(16).unwrap_or(0);
                let v = (v << 4) | digit;
                if n < 3 {
                    self.hex = Some((n + 1, v));
                    continue;
                }
                self.hex = None;
                match v {
                    0xD800..=0xDBFF if !self.high => self.high = true,
                    0xDC00..=0xDFFF if self.high => self.high = false,
                    0xD800..=0xDFFF => return Err(LONE.to_owned()),
                    _ if self.high => return Err(LONE.to_owned()),
                    _ => {}
                }
            } else if self.escape {
                self.escape = false;
                if b == b'u' {
                    self.hex = Some((0, 0));
                } else if self.high {
                    return Err(LONE.to_owned());
                }
            } else if b == b'\\' {
                self.escape = true;
            } else if self.high {
                return Err(LONE.to_owned());
            } else if b == b'"' {
                self.in_string = false;
            }
        }
        Ok(())
    }
}

/// Nesting the whole-answer reader allows (`serde_json`'s own limit).
const MAX_DEPTH: usize = 127;

/// Where a value is, by the member names from the message down.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    /// A message object's members.
    Message,
    /// `result`'s members.
    Result,
    /// `result.inputRequests`' members (one per request).
    InputRequests,
    /// The members of one input request.
    InputRequest,
    /// Anything else: the tool's own business.
    Other,
}

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
            escapes: Escapes::default(),
        }
    }

    /// Bytes scanned so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Scans the next bytes of the answer.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<(), String> {
        self.bytes += chunk.len();
        self.escapes.push(chunk)?;
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
        if self.batch.is_none() {
            return Err("the answer is not a JSON-RPC message or batch".to_owned());
        }
        if !self.stack.is_empty() {
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

    /// What the members of the innermost open object are.
    fn level(&self) -> Level {
        let md = self.message_depth();
        let depth = self.stack.len();
        if depth < md || !self.stack.last().is_some_and(|f| f.object) {
            return Level::Other;
        }
        let key = |d: usize| self.stack.get(d - 1).and_then(|f| f.key.as_deref());
        match depth - md {
            0 => Level::Message,
            1 if key(md) == Some("result") => Level::Result,
            2 if key(md) == Some("result") && key(md + 1) == Some("inputRequests") => {
                Level::InputRequests
            }
            3 if key(md) == Some("result") && key(md + 1) == Some("inputRequests") => {
                Level::InputRequest
            }
            _ => Level::Other,
        }
    }

    fn on(&mut self, event: JsonEvent) -> Result<(), String> {
        match event {
            JsonEvent::StartObject | JsonEvent::StartArray => {
                let object = event == JsonEvent::StartObject;
                if self.stack.len() >= MAX_DEPTH {
                    return Err(format!("the answer nests deeper than {MAX_DEPTH}"));
                }
                if self.batch.is_none() {
                    self.batch = Some(!object);
                }
                if self.stack.len() + 1 == self.message_depth() {
                    if !object {
                        return Err("a batch element is not a message object".to_owned());
                    }
                    self.current = Facts::default();
                }
                if self.stack.len() + 1 > self.message_depth() {
                    self.value_at(None, object)?;
                }
                self.stack.push(Frame {
                    object,
                    key: None,
                    seen: Vec::new(),
                    method: false,
                });
            }
            JsonEvent::EndObject | JsonEvent::EndArray => {
                if self.level() == Level::InputRequest
                    && !self.stack.last().is_some_and(|f| f.method)
                {
                    return Err("an input request without a method".to_owned());
                }
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
                self.value_at(Some(Scalar::Str(v)), false)?;
            }
            JsonEvent::ValueInt | JsonEvent::ValueFloat => {
                let text = self.parser.current_str().map_err(|e| e.to_string())?;
                // Read as the whole-answer reader reads it: serde_json's
                // double (a number out of its range is not JSON to it).
                let n: f64 = serde_json::from_str(text)
                    .map_err(|e| format!("a number the answer cannot hold: {e}"))?;
                let int = (event == JsonEvent::ValueInt)
                    .then(|| text.parse::<i64>().ok())
                    .flatten();
                self.value_at(Some(Scalar::Num(n, int)), false)?;
            }
            JsonEvent::ValueTrue => self.value_at(Some(Scalar::Bool(true)), false)?,
            JsonEvent::ValueFalse => self.value_at(Some(Scalar::Bool(false)), false)?,
            JsonEvent::ValueNull => self.value_at(Some(Scalar::Null), false)?,
            JsonEvent::NeedMoreInput => {}
        }
        Ok(())
    }

    /// Refuses repeated or case-imitating keys where the decisions read:
    /// a message, its `result`, and the input requests; the same keys and
    /// the same comparison as the whole-answer reader.
    fn check_key(&mut self, key: &str) -> Result<(), String> {
        let known: &[&str] = match self.level() {
            Level::Message => MESSAGE_MEMBERS,
            Level::Result => RESULT_MEMBERS,
            Level::InputRequests | Level::InputRequest => &[],
            Level::Other => return Ok(()),
        };
        if let Some(m) = known.iter().find(|m| Folded::eq_str(m, key) && **m != key) {
            return Err(format!("the answer has a member {key:?} imitating {m:?}"));
        }
        let Some(top) = self.stack.last_mut() else {
            return Ok(());
        };
        if top.seen.iter().any(|k| Folded::eq_str(k, key)) {
            return Err(format!("the answer repeats the member {key:?}"));
        }
        top.seen.push(key.to_owned());
        Ok(())
    }

    /// A value (scalar, or a container when `None`) at the current path.
    fn value_at(&mut self, scalar: Option<Scalar>, object: bool) -> Result<(), String> {
        if self.batch == Some(true) && self.stack.len() == 1 {
            return Err("a batch element is not a message object".to_owned());
        }
        if !self.stack.last().is_some_and(|f| f.object) {
            return Ok(());
        }
        match self.level() {
            Level::InputRequests if !object => {
                return Err("an input request that is not an object".to_owned());
            }
            Level::InputRequest
                if self.stack.last().and_then(|f| f.key.as_deref()) == Some("method") =>
            {
                let Some(Scalar::Str(s)) = scalar else {
                    return Err("an input request whose method is not a string".to_owned());
                };
                if let Some(top) = self.stack.last_mut() {
                    top.method = true;
                }
                self.current.input_methods.push(s);
                return Ok(());
            }
            _ => {}
        }
        let path = self.path();
        let cost_key = self.cost_key.as_str();
        match (path.as_slice(), scalar) {
            (["id"], Some(Scalar::Num(_, Some(n)))) => self.current.id = Some(Id::Number(n)),
            (["id"], Some(Scalar::Str(s))) => self.current.id = Some(Id::String(s)),
            (["error"], _) => self.current.error = true,
            (["result", "isError"], Some(Scalar::Bool(b))) => self.current.is_error = b,
            (["result", "resultType"], Some(Scalar::Str(s))) => {
                self.current.result_type = Some(s);
            }
            (["result", "inputRequests"], s) if s.is_some() || !object => {
                return Err("input requests that are not an object".to_owned());
            }
            (["result", "_meta", k], Some(Scalar::Num(n, _))) if *k == cost_key => {
                self.current.cost = Some(n);
            }
            _ => {}
        }
        Ok(())
    }
}

enum Scalar {
    Str(String),
    /// serde_json's double, and the integer when the text is one in `i64`.
    Num(f64, Option<i64>),
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
