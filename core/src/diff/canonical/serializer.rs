//! The canonicalizing `serde::Serializer`.

use std::borrow::Cow;

use serde::Serialize;
use serde::ser::{self, Impossible};

use super::write::{write_f32, write_f64, write_i128, write_string, write_u128};
use super::{Error, NUMBER_TOKEN, RAW_VALUE_TOKEN, Seg, check_depth, write_nested};

/// Writes one value's canonical text into `out`; `path` leads from the root to it.
pub(super) struct Canon<'a> {
    pub(super) out: &'a mut String,
    pub(super) path: &'a mut Vec<Seg>,
}

impl<'a> Canon<'a> {
    fn seq(self, open_variant: Option<&'static str>) -> Result<Seq<'a>, Error> {
        check_depth(self.path, 1 + usize::from(open_variant.is_some()))?;
        let base = self.path.len();
        if let Some(variant) = open_variant {
            self.out.push('{');
            write_string(self.out, variant);
            self.out.push(':');
            self.path.push(Seg::Field(variant));
        }
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            path: self.path,
            next: 0,
            base,
            in_variant: open_variant.is_some(),
        })
    }

    fn object(
        self,
        open_variant: Option<&'static str>,
        len: Option<usize>,
    ) -> Result<Object<'a>, Error> {
        check_depth(self.path, 1 + usize::from(open_variant.is_some()))?;
        let base = self.path.len();
        if let Some(variant) = open_variant {
            self.out.push('{');
            write_string(self.out, variant);
            self.out.push(':');
            self.path.push(Seg::Field(variant));
        }
        Ok(Object {
            out: self.out,
            path: self.path,
            members: Vec::with_capacity(len.unwrap_or(0)),
            pending_key: None,
            base,
            in_variant: open_variant.is_some(),
        })
    }
}

/// `Serializer` methods for the integers that fit an `i128`: each writes its value in decimal.
macro_rules! integers {
    ($($method:ident($ty:ty),)*) => {
        $(
            fn $method(self, v: $ty) -> Result<(), Error> {
                write_i128(self.out, i128::from(v))
            }
        )*
    };
}

impl<'a> ser::Serializer for Canon<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Struct<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }

    integers! {
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
    }

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        write_i128(self.out, v)
    }

    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        write_u128(self.out, v)
    }

    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        write_f32(self.out, v)
    }

    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        write_f64(self.out, v)
    }

    fn serialize_char(self, v: char) -> Result<(), Error> {
        write_string(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_string(self.out, v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // As serde_json: an array of numbers.
        self.out.push('[');
        for (at, byte) in v.iter().enumerate() {
            if at > 0 {
                self.out.push(',');
            }
            self.out.push_str(&byte.to_string());
        }
        self.out.push(']');
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        // As serde_json: a unit struct carries no data and is `null`.
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        write_string(self.out, variant);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        check_depth(self.path, 1)?;
        self.out.push('{');
        write_string(self.out, variant);
        self.out.push(':');
        write_nested(self.out, self.path, Seg::Field(variant), value)?;
        self.out.push('}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
        self.seq(None)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, Error> {
        self.seq(None)
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq<'a>, Error> {
        self.seq(None)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Error> {
        self.seq(Some(variant))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Object<'a>, Error> {
        self.object(None, len)
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Struct<'a>, Error> {
        Ok(match name {
            RAW_VALUE_TOKEN => Struct::Embedded {
                out: self.out,
                path: self.path,
                kind: Embedded::JsonText,
            },
            NUMBER_TOKEN => Struct::Embedded {
                out: self.out,
                path: self.path,
                kind: Embedded::Number,
            },
            _ => Struct::Object(self.object(None, Some(len))?),
        })
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Object<'a>, Error> {
        self.object(Some(variant), Some(len))
    }
}

/// An array (sequences, tuples, tuple structs), or the array inside a tuple variant's object.
pub(super) struct Seq<'a> {
    pub(super) out: &'a mut String,
    pub(super) path: &'a mut Vec<Seg>,
    pub(super) next: usize,
    /// The path depth to return to at the end.
    pub(super) base: usize,
    /// Inside `{"Variant":[...]}`: close the object too.
    pub(super) in_variant: bool,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if self.next > 0 {
            self.out.push(',');
        }
        write_nested(self.out, self.path, Seg::Index(self.next), value)?;
        self.next += 1;
        Ok(())
    }

    fn finish(self) -> Result<(), Error> {
        self.out.push(']');
        if self.in_variant {
            self.out.push('}');
        }
        self.path.truncate(self.base);
        Ok(())
    }
}

/// The four sequence traits of serde, each writing an element with [`Seq::element`] and closing
/// with [`Seq::finish`]: `$trait` names the trait, `$method` its element method.
macro_rules! seq_impl {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }

            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

seq_impl!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

/// An object (maps, structs), or the object inside a struct variant's object. Members are
/// collected, then written sorted by key at the end.
pub(super) struct Object<'a> {
    pub(super) out: &'a mut String,
    pub(super) path: &'a mut Vec<Seg>,
    /// `(key, canonical text of the value)`.
    pub(super) members: Vec<(Cow<'static, str>, String)>,
    /// A map key waiting for its value.
    pub(super) pending_key: Option<String>,
    /// The path depth to return to at the end.
    pub(super) base: usize,
    /// Inside `{"Variant":{...}}`: close the outer object too.
    pub(super) in_variant: bool,
}

impl Object<'_> {
    fn member<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        let mut text = String::new();
        write_nested(&mut text, self.path, Seg::Field(key), value)?;
        self.members.push((Cow::Borrowed(key), text));
        Ok(())
    }

    fn finish(mut self) -> Result<(), Error> {
        // RFC 8785 §3.2.3: sort by the keys' UTF-16 code units.
        self.members
            .sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
        // `windows(2)` hands out slices of exactly two members: both indexes exist.
        if let Some(pair) = self.members.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            let mut key = String::new();
            write_string(&mut key, &pair[0].0);
            return Err(Error::new(format!("duplicate object key {key}")).located(self.path));
        }
        let len: usize = self
            .members
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum();
        self.out.reserve(len + 2);
        self.out.push('{');
        for (at, (key, value)) in self.members.iter().enumerate() {
            if at > 0 {
                self.out.push(',');
            }
            write_string(self.out, key);
            self.out.push(':');
            self.out.push_str(value);
        }
        self.out.push('}');
        if self.in_variant {
            self.out.push('}');
        }
        self.path.truncate(self.base);
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        let key = key
            .serialize(StringCapture {
                what: "object keys",
            })
            .map_err(|error| error.located(self.path))?;
        self.pending_key = Some(key);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let Some(key) = self.pending_key.take() else {
            return Err(Error::new("a map value was written without its key").located(self.path));
        };
        let mut text = String::new();
        let key = match write_nested(&mut text, self.path, Seg::Key(key), value)? {
            Seg::Key(key) => key,
            _ => {
                return Err(
                    Error::new("internal error: path stack out of balance").located(self.path)
                );
            }
        };
        self.members.push((Cow::Owned(key), text));
        Ok(())
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.member(key, value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

/// What serde_json's private struct tokens carry.
pub(super) enum Embedded {
    /// `RawValue`: a complete JSON text.
    JsonText,
    /// `Number` with `arbitrary_precision`: the number's digits.
    Number,
}

/// A struct: an ordinary one becomes an object; serde_json's private token structs carry JSON
/// text that is parsed and canonicalized in place.
pub(super) enum Struct<'a> {
    Object(Object<'a>),
    Embedded {
        out: &'a mut String,
        path: &'a mut Vec<Seg>,
        kind: Embedded,
    },
}

impl ser::SerializeStruct for Struct<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        match self {
            Struct::Object(object) => object.member(key, value),
            Struct::Embedded { out, path, kind } => {
                let text = value.serialize(StringCapture {
                    what: "serde_json's embedded JSON text",
                })?;
                match kind {
                    Embedded::JsonText => write_json_text(out, path, &text),
                    Embedded::Number => {
                        let number: f64 = text.parse().map_err(|error| {
                            Error::new(format!("embedded number {text:?} does not parse: {error}"))
                        })?;
                        write_f64(out, number)
                    }
                }
            }
        }
    }

    fn end(self) -> Result<(), Error> {
        match self {
            Struct::Object(object) => object.finish(),
            Struct::Embedded { .. } => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Capturing a string (map keys, serde_json's embedded text)
// ---------------------------------------------------------------------------------------------

/// Accepts what serde_json accepts as a map key (strings, chars, unit variants, newtype structs
/// around those) and hands back the string; rejects everything else.
pub(super) struct StringCapture {
    /// What must be a string, for the error message.
    pub(super) what: &'static str,
}

impl StringCapture {
    fn reject(&self, got: &str) -> Error {
        Error::new(format!("{} must be strings, got {got}", self.what))
    }
}

/// `Serializer` methods for what a map key cannot be: each rejects its input, naming what it
/// got.
macro_rules! reject {
    ($($method:ident($($ty:ty),*) -> $ret:ty => $got:literal,)*) => {
        $(
            fn $method(self, $(_: $ty),*) -> Result<$ret, Error> {
                Err(self.reject($got))
            }
        )*
    };
}

impl ser::Serializer for StringCapture {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = Impossible<String, Error>;
    type SerializeTuple = Impossible<String, Error>;
    type SerializeTupleStruct = Impossible<String, Error>;
    type SerializeTupleVariant = Impossible<String, Error>;
    type SerializeMap = Impossible<String, Error>;
    type SerializeStruct = Impossible<String, Error>;
    type SerializeStructVariant = Impossible<String, Error>;

    fn serialize_str(self, v: &str) -> Result<String, Error> {
        Ok(v.to_owned())
    }

    fn serialize_char(self, v: char) -> Result<String, Error> {
        Ok(v.to_string())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result<String, Error> {
        Ok(variant.to_owned())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }

    reject! {
        serialize_bool(bool) -> String => "a boolean",
        serialize_i8(i8) -> String => "an integer",
        serialize_i16(i16) -> String => "an integer",
        serialize_i32(i32) -> String => "an integer",
        serialize_i64(i64) -> String => "an integer",
        serialize_i128(i128) -> String => "an integer",
        serialize_u8(u8) -> String => "an integer",
        serialize_u16(u16) -> String => "an integer",
        serialize_u32(u32) -> String => "an integer",
        serialize_u64(u64) -> String => "an integer",
        serialize_u128(u128) -> String => "an integer",
        serialize_f32(f32) -> String => "a number",
        serialize_f64(f64) -> String => "a number",
        serialize_bytes(&[u8]) -> String => "bytes",
        serialize_none() -> String => "null",
        serialize_unit() -> String => "null",
        serialize_unit_struct(&'static str) -> String => "a unit struct",
        serialize_seq(Option<usize>) -> Self::SerializeSeq => "an array",
        serialize_tuple(usize) -> Self::SerializeTuple => "a tuple",
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct
            => "a tuple struct",
        serialize_tuple_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeTupleVariant => "an enum variant with data",
        serialize_map(Option<usize>) -> Self::SerializeMap => "an object",
        serialize_struct(&'static str, usize) -> Self::SerializeStruct => "a struct",
        serialize_struct_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeStructVariant => "an enum variant with data",
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, Error> {
        Err(self.reject("an option"))
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, Error> {
        Err(self.reject("an enum variant with data"))
    }
}

/// Parses embedded JSON text and writes its canonical form.
fn write_json_text(out: &mut String, path: &mut Vec<Seg>, text: &str) -> Result<(), Error> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|error| Error::new(format!("embedded JSON text does not parse: {error}")))?;
    value.serialize(Canon { out, path })
}

// ---------------------------------------------------------------------------------------------
// The serializer
// ---------------------------------------------------------------------------------------------
