//! The chat-completions wire format: the request body we send and the tolerant parsing of the
//! response body (string or content-part lists, optional `model` and `usage`).

use deermem_core::LlmError;
use deermem_core::ports::{ChatRequest, ChatResponse, TokenUsage};
use deermem_remote::http::excerpt;
use serde_json::{Value, json};

/// Builds the JSON body for `POST /chat/completions`.
///
/// The request's own `temperature` / `max_tokens` win over the configured defaults.
pub(crate) fn request_body(
    model: &str,
    request: &ChatRequest,
    default_temperature: Option<f64>,
    default_max_tokens: Option<u32>,
) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    let mut body = json!({"model": model, "messages": messages});
    if let Some(t) = request
        .temperature
        .or(default_temperature)
        .and_then(serde_json::Number::from_f64)
    {
        body["temperature"] = Value::Number(t);
    }
    if let Some(n) = request.max_tokens.or(default_max_tokens) {
        body["max_tokens"] = json!(n);
    }
    if request.json_response {
        body["response_format"] = json!({"type": "json_object"});
    }
    body
}

/// Parses a successful (2xx) response body.
///
/// # Errors
/// [`LlmError::InvalidResponse`] for a body that is not JSON, has no `choices[0].message`, or
/// whose content is neither a string nor a list of text parts.
pub(crate) fn parse_response(body: &[u8]) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        LlmError::InvalidResponse(format!(
            "body is not JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(body), 200)
        ))
    })?;
    let Some(obj) = v.as_object() else {
        return Err(LlmError::InvalidResponse(format!(
            "body is not a JSON object: {}",
            excerpt(&v.to_string(), 200)
        )));
    };
    if let Some(err) = obj.get("error").filter(|e| !e.is_null()) {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_owned);
        return Err(LlmError::InvalidResponse(format!(
            "server reported an error: {}",
            excerpt(&msg, 300)
        )));
    }
    let message = obj
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("message"))
        .and_then(Value::as_object)
        .ok_or_else(|| LlmError::InvalidResponse("missing choices[0].message".into()))?;
    let content = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => join_parts(parts)?,
        None | Some(Value::Null) => {
            let why = if let Some(r) = message.get("refusal").and_then(Value::as_str) {
                format!("the model refused: {}", excerpt(r, 200))
            } else if message.get("tool_calls").is_some_and(|t| !t.is_null()) {
                "the model answered with tool calls instead of text".to_owned()
            } else {
                "choices[0].message.content is missing".to_owned()
            };
            return Err(LlmError::InvalidResponse(why));
        }
        Some(other) => {
            return Err(LlmError::InvalidResponse(format!(
                "choices[0].message.content has an unexpected type: {}",
                excerpt(&other.to_string(), 100)
            )));
        }
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_owned);
    let usage = obj.get("usage").and_then(Value::as_object).map(|u| {
        let count = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        TokenUsage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
        }
    });
    Ok(ChatResponse {
        content,
        model,
        usage,
    })
}

/// Joins the `text` of content parts (`[{"type": "text", "text": "..."}]`; bare strings are
/// accepted too). Parts without text (images, audio) are skipped.
fn join_parts(parts: &[Value]) -> Result<String, LlmError> {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) => o.get("text").and_then(Value::as_str),
            _ => None,
        })
        .collect();
    if !texts.is_empty() || parts.is_empty() {
        Ok(texts.concat())
    } else {
        Err(LlmError::InvalidResponse(
            "choices[0].message.content holds no text parts".into(),
        ))
    }
}

/// The first `max_chars` characters of `s`, with `…` when cut.
#[cfg(test)]
mod tests {
    use deermem_core::ports::ChatMessage;

    use super::*;

    #[test]
    fn body_has_model_messages_and_options() {
        let req = ChatRequest {
            messages: vec![ChatMessage::system("s"), ChatMessage::user("u")],
            temperature: None,
            max_tokens: Some(7),
            json_response: true,
        };
        let b = request_body("m", &req, Some(0.3), Some(100));
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                   "temperature": 0.3, "max_tokens": 7, "response_format": {"type": "json_object"}})
        );
        let plain = request_body("m", &ChatRequest::default(), None, None);
        assert_eq!(plain, json!({"model": "m", "messages": []}));
    }

    #[test]
    fn parses_string_and_part_lists() {
        let r = parse_response(br#"{"model":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#).unwrap();
        assert_eq!(r.content, "hi");
        assert_eq!(r.model.as_deref(), Some("x"));
        assert_eq!(
            r.usage,
            Some(TokenUsage {
                prompt_tokens: 3,
                completion_tokens: 4
            })
        );
        let r = parse_response(br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"image_url"},"b"]}}]}"#).unwrap();
        assert_eq!(r.content, "ab");
        assert!(r.usage.is_none());
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        for body in [
            &b"not json"[..],
            b"[]",
            b"{}",
            br#"{"choices":[]}"#,
            br#"{"choices":[{"message":{"content":5}}]}"#,
            br#"{"choices":[{"message":{"content":null,"refusal":"no"}}]}"#,
            br#"{"choices":[{"message":{"content":null,"tool_calls":[{}]}}]}"#,
            br#"{"choices":[{"message":{"content":[{"type":"image"}]}}]}"#,
            br#"{"error":{"message":"overloaded"}}"#,
        ] {
            let e = parse_response(body).unwrap_err();
            assert!(
                matches!(e, LlmError::InvalidResponse(_)),
                "{body:?} gave {e:?}"
            );
        }
    }
}
