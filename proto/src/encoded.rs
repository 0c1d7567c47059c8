//! Messages of the State API written by hand instead of generated, so that a server can send
//! what it encoded once: [`WatchResponse`] (`repeated Event event = 1;`) with events encoded
//! once for all watchers, and [`ResourceResponse`] (`Resource resource = 1;`, the shape of
//! `GetResponse`, `ListResponse`, `CreateResponse` and `UpdateResponse`) with a resource encoded
//! once for the run log, the reply and the watchers.
//!
//! A broker with W watchers of a kind sends each event W times. With the generated type each
//! send cloned the event (strings, label maps, the spec, and the same again for the old
//! resource) and prost encoded it again. Here the server puts the bytes of an encoded `Event`
//! in [`WatchResponse::encoded`] (a reference-counted [`Bytes`]: cloning it for a watcher is a
//! counter increment) and the encoder copies them into the frame as they are. The wire format
//! is the generated types', byte for byte: field 1, length-delimited messages. No crate offers a
//! prost message with pre-encoded fields, and these are prost's own encoding helpers around a
//! few lines each, so they live here.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use crate::resource::{Event, Resource};

/// `cosi.resource.WatchResponse`.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct WatchResponse {
    /// The events: what a decoded response holds, and what a sender may fill instead of
    /// `encoded`.
    pub event: Vec<Event>,
    /// Events already encoded, each the bytes of one `Event` message (without its tag and
    /// length). Sent before `event`; a decoded response has none (they land in `event`).
    pub encoded: Vec<Bytes>,
}

const EVENT_TAG: u32 = 1;
const RESOURCE_TAG: u32 = 1;

/// Writes `bytes` as the length-delimited field `tag`.
fn put_bytes_field(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

/// What [`put_bytes_field`] writes.
fn bytes_field_len(tag: u32, bytes: &[u8]) -> usize {
    encoding::key_len(tag) + encoding::encoded_len_varint(bytes.len() as u64) + bytes.len()
}

/// `cosi.resource.GetResponse`, `ListResponse`, `CreateResponse` and `UpdateResponse`: one
/// resource (`Resource resource = 1;`).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct ResourceResponse {
    /// The resource: what a decoded response holds.
    pub resource: Option<Resource>,
    /// The resource already encoded (the bytes of a `Resource` message), sent instead of
    /// `resource` when set; a decoded response has none.
    pub encoded: Option<Bytes>,
}

impl ResourceResponse {
    /// A response of a resource.
    pub fn new(resource: Resource) -> Self {
        Self {
            resource: Some(resource),
            encoded: None,
        }
    }

    /// A response of a resource already encoded.
    pub fn encoded(encoded: Bytes) -> Self {
        Self {
            resource: None,
            encoded: Some(encoded),
        }
    }
}

impl prost::Message for ResourceResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(e) = &self.encoded {
            put_bytes_field(RESOURCE_TAG, e, buf);
        } else if let Some(r) = &self.resource {
            encoding::message::encode(RESOURCE_TAG, r, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == RESOURCE_TAG {
            encoding::message::merge(
                wire_type,
                self.resource.get_or_insert_with(Default::default),
                buf,
                ctx,
            )
            .map_err(|mut e| {
                e.push("Response", "resource");
                e
            })
        } else {
            encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        if let Some(e) = &self.encoded {
            bytes_field_len(RESOURCE_TAG, e)
        } else if let Some(r) = &self.resource {
            encoding::message::encoded_len(RESOURCE_TAG, r)
        } else {
            0
        }
    }

    fn clear(&mut self) {
        self.resource = None;
        self.encoded = None;
    }
}

impl WatchResponse {
    /// A response of events already encoded.
    pub fn encoded(encoded: Vec<Bytes>) -> Self {
        Self {
            event: Vec::new(),
            encoded,
        }
    }

    /// Whether the response carries no event (COSI's "watch established" marker).
    pub fn is_empty(&self) -> bool {
        self.event.is_empty() && self.encoded.is_empty()
    }

    /// What one encoded event adds to a response's size.
    pub fn encoded_event_len(event: &Bytes) -> usize {
        bytes_field_len(EVENT_TAG, event)
    }
}

impl prost::Message for WatchResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for e in &self.encoded {
            put_bytes_field(EVENT_TAG, e, buf);
        }
        for e in &self.event {
            encoding::message::encode(EVENT_TAG, e, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == EVENT_TAG {
            encoding::message::merge_repeated(wire_type, &mut self.event, buf, ctx).map_err(
                |mut e| {
                    e.push("WatchResponse", "event");
                    e
                },
            )
        } else {
            encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        self.encoded
            .iter()
            .map(Self::encoded_event_len)
            .sum::<usize>()
            + encoding::message::encoded_len_repeated(EVENT_TAG, &self.event)
    }

    fn clear(&mut self) {
        self.event.clear();
        self.encoded.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Metadata, Resource, Spec};
    use prost::Message;

    /// The generated type, for comparison.
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct Generated {
        #[prost(message, repeated, tag = "1")]
        event: Vec<Event>,
    }

    fn event(id: &str, bookmark: &[u8]) -> Event {
        Event {
            resource: Some(Resource {
                metadata: Some(Metadata {
                    namespace: "ns".into(),
                    r#type: "T".into(),
                    id: id.into(),
                    version: "3".into(),
                    labels: [("k".to_string(), "v".to_string())].into(),
                    ..Default::default()
                }),
                spec: Some(Spec {
                    proto_spec: vec![7; 300],
                    yaml_spec: String::new(),
                }),
            }),
            event_type: 1,
            old: None,
            error: None,
            bookmark: Some(bookmark.to_vec()),
        }
    }

    #[test]
    fn same_bytes_as_the_generated_type_and_decodes_back() {
        let events = vec![event("a", b"12345678abcdefgh"), event("b", b"x")];
        let generated = Generated {
            event: events.clone(),
        }
        .encode_to_vec();
        let pre = WatchResponse::encoded(
            events
                .iter()
                .map(|e| Bytes::from(e.encode_to_vec()))
                .collect(),
        );
        assert_eq!(pre.encoded_len(), generated.len());
        assert_eq!(pre.encode_to_vec(), generated);
        let plain = WatchResponse {
            event: events.clone(),
            encoded: Vec::new(),
        };
        assert_eq!(plain.encode_to_vec(), generated);

        let decoded = WatchResponse::decode(generated.as_slice()).expect("decodes");
        assert_eq!(decoded.event, events);
        assert!(decoded.encoded.is_empty());
        assert!(WatchResponse::default().is_empty());
        assert!(!pre.is_empty());
        assert!(WatchResponse::default().encode_to_vec().is_empty());
    }

    /// The generated `GetResponse`, for comparison.
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct GeneratedResource {
        #[prost(message, optional, tag = "1")]
        resource: Option<Resource>,
    }

    #[test]
    fn resource_response_same_bytes_as_the_generated_type() {
        let r = event("a", b"x").resource.expect("resource");
        let generated = GeneratedResource {
            resource: Some(r.clone()),
        }
        .encode_to_vec();
        let pre = ResourceResponse::encoded(Bytes::from(r.encode_to_vec()));
        assert_eq!(pre.encoded_len(), generated.len());
        assert_eq!(pre.encode_to_vec(), generated);
        assert_eq!(ResourceResponse::new(r.clone()).encode_to_vec(), generated);
        let decoded = ResourceResponse::decode(generated.as_slice()).expect("decodes");
        assert_eq!(decoded.resource, Some(r));
        assert!(decoded.encoded.is_none());
        let empty = GeneratedResource { resource: None }.encode_to_vec();
        assert_eq!(ResourceResponse::default().encode_to_vec(), empty);
        assert_eq!(
            ResourceResponse::decode(&[][..]).expect("decodes"),
            ResourceResponse::default()
        );
    }

    #[test]
    fn garbage_is_an_error_and_unknown_fields_are_skipped() {
        assert!(WatchResponse::decode(&[0x0a, 0x05, 0x01][..]).is_err());
        // Field 2 (unknown, varint 1), then one event.
        let mut bytes = vec![0x10, 0x01];
        bytes.extend(
            Generated {
                event: vec![event("a", b"b")],
            }
            .encode_to_vec(),
        );
        let decoded = WatchResponse::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded.event.len(), 1);
    }
}
