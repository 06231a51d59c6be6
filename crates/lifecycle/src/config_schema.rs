//! What a config type reads, asked of the type itself: its `Deserialize` is driven by a probe
//! that walks down a key path and reports what it finds there (a struct's field names, a map
//! of free keys, a list), without any value. Every config type of the program registers itself
//! with [`config_schema!`](crate::config_schema), so the loader knows the keys of every service.

use std::cell::Cell;

use serde::de::{self, DeserializeOwned, IntoDeserializer as _, Visitor};

/// One step of a key path: a table key or a position in an array of tables.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Segment {
    /// A key of a table.
    Key(String),
    /// A position in an array.
    Index(usize),
}

/// What a config type expects at a key path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A struct: only these keys.
    Struct(&'static [&'static str]),
    /// A map whose keys are the user's (`[agents.<id>]`): any key.
    Map,
    /// A list.
    Seq,
    /// A value whose inside the type checks itself (a number, a list given as text or as
    /// tables, an enum): nothing to say about keys below it.
    Opaque,
    /// Nothing: the type has no such key on the way.
    Absent,
}

/// The keys one config type reads, registered with [`config_schema!`](crate::config_schema).
#[derive(Clone, Copy)]
pub struct Schema {
    shape_at: fn(&[Segment]) -> Shape,
}

impl Schema {
    /// Returns the schema of `T`, a type deserialized from the whole configuration document.
    pub const fn of<T: DeserializeOwned>() -> Self {
        Self {
            shape_at: shape_at::<T>,
        }
    }

    /// Returns what this type expects at `path`.
    pub(crate) fn shape_at(&self, path: &[Segment]) -> Shape {
        (self.shape_at)(path)
    }

    /// Returns every schema registered in this program.
    pub(crate) fn registered() -> impl Iterator<Item = &'static Schema> {
        inventory::iter::<Schema>.into_iter()
    }
}

inventory::collect!(Schema);

/// Registers a config type as part of the product's configuration document, so that a key it
/// reads is accepted by every service of the program, not only by the one that reads it.
#[macro_export]
macro_rules! config_schema {
    ($config:ty) => {
        $crate::__inventory::submit! { $crate::Schema::of::<$config>() }
    };
}

/// `[telemetry]`, read by the binary for every process; its type lives below the services.
#[derive(serde::Deserialize)]
struct Telemetry {
    #[serde(rename = "telemetry")]
    _section: agentloop_telemetry::TelemetryConfig,
}

/// The client part of `[memory]`, read by every client of the memory service.
#[derive(serde::Deserialize)]
struct MemoryClient {
    #[serde(rename = "memory")]
    _section: crate::MemoryEndpoint,
}

crate::config_schema!(Telemetry);
crate::config_schema!(MemoryClient);

fn shape_at<T: DeserializeOwned>(path: &[Segment]) -> Shape {
    let found = Cell::new(None);
    // The probe always ends in an error, once it has recorded what it found.
    let _ = T::deserialize(Probe {
        path,
        found: &found,
    });
    found.get().unwrap_or(Shape::Opaque)
}

/// A deserializer holding no value: it offers the type one key at a time, the next one of
/// `path`, and records what the type asks for once the path is walked.
struct Probe<'a> {
    path: &'a [Segment],
    found: &'a Cell<Option<Shape>>,
}

impl Probe<'_> {
    fn stop<T>(&self, shape: Shape) -> Result<T, de::value::Error> {
        if self.found.get().is_none() {
            self.found.set(Some(shape));
        }
        Err(de::Error::custom("probed"))
    }
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.stop(Shape::Opaque)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.path.split_first() {
            None => self.stop(Shape::Struct(fields)),
            Some((Segment::Key(key), rest)) if fields.contains(&key.as_str()) => {
                visitor.visit_map(Entry::new(key, rest, self.found))
            }
            Some(_) => self.stop(Shape::Absent),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.path.split_first() {
            None => self.stop(Shape::Map),
            Some((Segment::Key(key), rest)) => visitor.visit_map(Entry::new(key, rest, self.found)),
            Some(_) => self.stop(Shape::Absent),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.path.split_first() {
            None => self.stop(Shape::Seq),
            Some((Segment::Index(_), rest)) => visitor.visit_seq(Element {
                probe: Some(Probe {
                    path: rest,
                    found: self.found,
                }),
            }),
            Some(_) => self.stop(Shape::Absent),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct tuple tuple_struct enum identifier ignored_any
    }
}

/// A table of one entry: the next key of the path, its value probed further.
struct Entry<'a> {
    key: Option<&'a str>,
    value: Probe<'a>,
}

impl<'a> Entry<'a> {
    fn new(key: &'a str, rest: &'a [Segment], found: &'a Cell<Option<Shape>>) -> Self {
        Self {
            key: Some(key),
            value: Probe { path: rest, found },
        }
    }
}

impl<'de> de::MapAccess<'de> for Entry<'_> {
    type Error = de::value::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.key.take() {
            Some(key) => seed.deserialize(key.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        seed.deserialize(Probe {
            path: self.value.path,
            found: self.value.found,
        })
    }
}

/// A list of one element, probed further.
struct Element<'a> {
    probe: Option<Probe<'a>>,
}

impl<'de> de::SeqAccess<'de> for Element<'_> {
    type Error = de::value::Error;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.probe.take().map(|p| seed.deserialize(p)).transpose()
    }
}

/// Config types shaped like the services': a runner's view of the document (through
/// `from`, as the runner's is) and a gateway's.
#[cfg(test)]
#[allow(dead_code)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    #[derive(serde::Deserialize)]
    pub(crate) struct Hook {
        subject: String,
    }

    #[derive(serde::Deserialize)]
    pub(crate) struct Agent {
        model: String,
        timeout_ms: Option<u64>,
    }

    #[derive(serde::Deserialize)]
    pub(crate) struct Runner {
        max_turns: u32,
        hooks: Vec<Hook>,
    }

    /// `[runner]` and `[agents.<id>]`.
    #[derive(serde::Deserialize)]
    #[serde(from = "RawRunnerView")]
    pub(crate) struct RunnerView {
        runner: Runner,
        agents: BTreeMap<String, Agent>,
    }

    #[derive(serde::Deserialize)]
    struct RawRunnerView {
        runner: Runner,
        agents: BTreeMap<String, Agent>,
    }

    impl From<RawRunnerView> for RunnerView {
        fn from(raw: RawRunnerView) -> Self {
            Self {
                runner: raw.runner,
                agents: raw.agents,
            }
        }
    }

    #[derive(serde::Deserialize)]
    pub(crate) struct Gateway {
        listen: String,
    }

    /// `[gateway]` only.
    #[derive(serde::Deserialize)]
    pub(crate) struct GatewayView {
        gateway: Gateway,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(keys: &[&str]) -> Vec<Segment> {
        keys.iter()
            .map(|k| match k.parse() {
                Ok(i) => Segment::Index(i),
                Err(_) => Segment::Key((*k).to_owned()),
            })
            .collect()
    }

    #[test]
    fn the_probe_finds_fields_maps_and_lists_at_any_depth() {
        let doc = Schema::of::<fixtures::RunnerView>();
        assert_eq!(doc.shape_at(&[]), Shape::Struct(&["runner", "agents"]));
        assert_eq!(
            doc.shape_at(&path(&["runner"])),
            Shape::Struct(&["max_turns", "hooks"])
        );
        assert_eq!(doc.shape_at(&path(&["runner", "hooks"])), Shape::Seq);
        assert_eq!(
            doc.shape_at(&path(&["runner", "hooks", "0"])),
            Shape::Struct(&["subject"])
        );
        assert_eq!(doc.shape_at(&path(&["agents"])), Shape::Map);
        assert_eq!(
            doc.shape_at(&path(&["agents", "any-id"])),
            Shape::Struct(&["model", "timeout_ms"])
        );
        assert_eq!(doc.shape_at(&path(&["runner", "max_turns"])), Shape::Opaque);
        assert_eq!(doc.shape_at(&path(&["runer", "max_turns"])), Shape::Absent);
        assert_eq!(doc.shape_at(&path(&["runner", "0"])), Shape::Absent);
    }

    #[test]
    fn the_shared_sections_are_registered() {
        let tops: Vec<Shape> = Schema::registered().map(|s| s.shape_at(&[])).collect();
        assert!(tops.contains(&Shape::Struct(&["telemetry"])), "{tops:?}");
        assert!(tops.contains(&Shape::Struct(&["memory"])), "{tops:?}");
    }
}
