//! The few pgoutput messages invalidation needs, decoded from the replication stream's
//! XLogData (protocol version 1, text tuples). Begin, Commit and logical messages are decoded
//! by `pgwire-replication` itself; Type and Origin messages are skipped.
//!
//! Format: <https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>

use std::collections::HashMap;

/// A relation as the stream last described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Relation {
    /// `schema.table`.
    pub table: String,
    pub columns: Vec<Column>,
    /// `f`: REPLICA IDENTITY FULL (the old row comes whole with every UPDATE and DELETE).
    pub identity_full: bool,
    /// `d`: REPLICA IDENTITY DEFAULT, the primary key (what earlier versions' point reads were
    /// named by: `deps.rs`, rolling deploys).
    pub identity_is_key: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Column {
    pub name: String,
    /// Part of the replica identity: its old value comes with an UPDATE that changes it.
    pub in_identity: bool,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cell {
    Null,
    /// A value the stream did not send: an unchanged TOASTed one, or an old one outside the
    /// replica identity. Whatever it was, entries named by it must go.
    Unsent,
    Text(String),
}

/// What a change message says, with its relation resolved.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Event<'a> {
    /// INSERT, UPDATE or DELETE of one row. `old` is the old row for UPDATE and DELETE (None
    /// for INSERT): whole under REPLICA IDENTITY FULL; else its identity columns (for an UPDATE
    /// that kept them, the new row's) and `Unsent` for the rest.
    Row {
        relation: &'a Relation,
        old: Option<Vec<Cell>>,
        new: Option<Vec<Cell>>,
    },
    Truncate {
        tables: Vec<String>,
    },
    /// The relation's definition changed since the stream last described it (DDL).
    Redefined {
        table: String,
    },
    /// A message invalidation does not need.
    Other,
}

#[derive(Debug, thiserror::Error)]
#[error("pgoutput: {0}")]
pub(super) struct DecodeError(&'static str);

/// Decodes a stream's messages, remembering its relations.
#[derive(Debug, Default)]
pub(super) struct Decoder {
    relations: HashMap<u32, Relation>,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("message truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> Result<i16, DecodeError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn cstr(&mut self) -> Result<String, DecodeError> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError("string without its terminator"))?;
        let s = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[end + 1..];
        Ok(s)
    }
    fn tuple(&mut self) -> Result<Vec<Cell>, DecodeError> {
        let n = self.i16()?.max(0) as usize;
        let mut cells = Vec::with_capacity(n);
        for _ in 0..n {
            cells.push(match self.u8()? {
                b'n' => Cell::Null,
                b'u' => Cell::Unsent,
                b't' | b'b' => {
                    let len = self.u32()? as usize;
                    Cell::Text(String::from_utf8_lossy(self.take(len)?).into_owned())
                }
                _ => return Err(DecodeError("unknown tuple column kind")),
            });
        }
        Ok(cells)
    }
}

impl Decoder {
    pub(super) fn decode(&mut self, data: &[u8]) -> Result<Event<'_>, DecodeError> {
        let mut r = Reader(data);
        match r.u8()? {
            b'R' => {
                let id = r.u32()?;
                let schema = r.cstr()?;
                let name = r.cstr()?;
                let identity = r.u8()?;
                let (identity_full, identity_is_key) = (identity == b'f', identity == b'd');
                let n = r.i16()?.max(0) as usize;
                let mut columns = Vec::with_capacity(n);
                for _ in 0..n {
                    let flags = r.u8()?;
                    let name = r.cstr()?;
                    r.take(8)?; // type oid, type modifier
                    columns.push(Column {
                        name,
                        in_identity: flags & 1 == 1,
                    });
                }
                let relation = Relation {
                    table: format!("{schema}.{name}"),
                    columns,
                    identity_full,
                    identity_is_key,
                };
                let table = relation.table.clone();
                match self.relations.insert(id, relation) {
                    Some(before) if Some(&before) != self.relations.get(&id) => {
                        Ok(Event::Redefined { table })
                    }
                    _ => Ok(Event::Other),
                }
            }
            b'I' => {
                let relation = self.relation(r.u32()?)?;
                if r.u8()? != b'N' {
                    return Err(DecodeError("INSERT without a new tuple"));
                }
                let new = Some(r.tuple()?);
                Ok(Event::Row {
                    relation,
                    old: None,
                    new,
                })
            }
            b'U' => {
                let relation = self.relation(r.u32()?)?;
                let mut old = None;
                let mut kind = r.u8()?;
                if kind == b'K' || kind == b'O' {
                    old = Some(old_row(relation, kind, r.tuple()?));
                    kind = r.u8()?;
                }
                if kind != b'N' {
                    return Err(DecodeError("UPDATE without a new tuple"));
                }
                let new = r.tuple()?;
                // The identity was not sent, so it did not change: the new row's.
                let old = old.unwrap_or_else(|| old_row(relation, b'K', new.clone()));
                Ok(Event::Row {
                    relation,
                    old: Some(old),
                    new: Some(new),
                })
            }
            b'D' => {
                let relation = self.relation(r.u32()?)?;
                let kind = r.u8()?;
                if kind != b'K' && kind != b'O' {
                    return Err(DecodeError("DELETE without its old row"));
                }
                let old = Some(old_row(relation, kind, r.tuple()?));
                Ok(Event::Row {
                    relation,
                    old,
                    new: None,
                })
            }
            b'T' => {
                let n = r.u32()? as usize;
                r.u8()?; // CASCADE / RESTART IDENTITY
                let mut tables = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    tables.push(self.relation(r.u32()?)?.table.clone());
                }
                Ok(Event::Truncate { tables })
            }
            _ => Ok(Event::Other),
        }
    }

    fn relation(&self, id: u32) -> Result<&Relation, DecodeError> {
        self.relations.get(&id).ok_or(DecodeError(
            "a change to a relation the stream has not described",
        ))
    }
}

/// An old row as sent (`O`: whole) or as its identity (`K`): the stream writes the columns
/// outside the identity as NULLs, which they need not be, so they are `Unsent`.
fn old_row(relation: &Relation, kind: u8, mut cells: Vec<Cell>) -> Vec<Cell> {
    if kind == b'K' && !relation.identity_full {
        for (cell, column) in cells.iter_mut().zip(&relation.columns) {
            if !column.in_identity {
                *cell = Cell::Unsent;
            }
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_msg(id: u32, cols: &[(&str, bool)]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0items\0d");
        m.extend((cols.len() as i16).to_be_bytes());
        for (name, key) in cols {
            m.push(u8::from(*key));
            m.extend(name.as_bytes());
            m.push(0);
            m.extend([0u8; 8]);
        }
        m
    }

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => m.push(b'n'),
                Some(t) => {
                    m.push(b't');
                    m.extend((t.len() as u32).to_be_bytes());
                    m.extend(t.as_bytes());
                }
            }
        }
        m
    }

    #[test]
    fn rows_truncates_and_redefinitions_decode() {
        let mut d = Decoder::default();
        let rel = relation_msg(7, &[("id", true), ("name", false)]);
        assert_eq!(d.decode(&rel).expect("relation"), Event::Other);
        assert_eq!(d.decode(&rel).expect("same again"), Event::Other);

        let mut upd = vec![b'U'];
        upd.extend(7u32.to_be_bytes());
        upd.push(b'K');
        upd.extend(tuple(&[Some("1"), None]));
        upd.push(b'N');
        upd.extend(tuple(&[Some("2"), Some("x")]));
        match d.decode(&upd).expect("update") {
            Event::Row { relation, old, new } => {
                assert_eq!(relation.table, "public.items");
                // The NULL sent for a column outside the identity is not a value.
                assert_eq!(old, Some(vec![Cell::Text("1".into()), Cell::Unsent]));
                assert_eq!(
                    new,
                    Some(vec![Cell::Text("2".into()), Cell::Text("x".into())])
                );
            }
            other => panic!("{other:?}"),
        }

        // An UPDATE that kept its identity sends no old row: the identity is the new row's.
        let mut kept = vec![b'U'];
        kept.extend(7u32.to_be_bytes());
        kept.push(b'N');
        kept.extend(tuple(&[Some("2"), Some("y")]));
        match d.decode(&kept).expect("update") {
            Event::Row { old, .. } => {
                assert_eq!(old, Some(vec![Cell::Text("2".into()), Cell::Unsent]));
            }
            other => panic!("{other:?}"),
        }

        let mut del = vec![b'D'];
        del.extend(7u32.to_be_bytes());
        del.push(b'K');
        del.extend(tuple(&[Some("3"), None]));
        assert!(matches!(d.decode(&del), Ok(Event::Row { new: None, .. })));

        let mut trunc = vec![b'T'];
        trunc.extend(1u32.to_be_bytes());
        trunc.push(0);
        trunc.extend(7u32.to_be_bytes());
        assert_eq!(
            d.decode(&trunc).expect("truncate"),
            Event::Truncate {
                tables: vec!["public.items".into()]
            }
        );

        let altered = relation_msg(7, &[("id", true), ("name", false), ("price", false)]);
        assert_eq!(
            d.decode(&altered).expect("redefined"),
            Event::Redefined {
                table: "public.items".into()
            }
        );
    }

    #[test]
    fn bad_messages_are_errors_not_panics() {
        let mut d = Decoder::default();
        for bad in [
            &b"I"[..],
            &b"I\0\0\0\x07N"[..],
            &b"R\0\0\0\x01pub"[..],
            &b"U\0\0\0\x01"[..],
        ] {
            assert!(d.decode(bad).is_err(), "{bad:?}");
        }
        assert_eq!(d.decode(b"Y").expect("type message"), Event::Other);
    }
}
