//! Postgres values map to JSON faithfully, parameters bind from JSON to the statement's types,
//! and an unsupported column type is a clear error naming the column and type.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn every_supported_type_maps_faithfully() {
    let stack = common::Stack::start();
    let r = stack.client.query(json!({"sql": r#"SELECT
        NULL::int AS null_int, true AS b,
        32767::int2 AS i2, (-2147483648)::int4 AS i4,
        9007199254740991::int8 AS i8_safe, 9007199254740993::int8 AS i8_big,
        (-9223372036854775807 - 1)::int8 AS i8_min,
        1.5::float4 AS f4, 1.2345678901234567::float8 AS f8,
        'NaN'::float8 AS f8_nan, '-Infinity'::float8 AS f8_ninf,
        12345678901234567890.123456789012345678901234567890::numeric AS num,
        'NaN'::numeric AS num_nan, 0.000012::numeric AS num_small,
        'héllo ✓'::text AS t, 'v'::varchar(5) AS vc, 'ab'::char(4) AS bp, 'nm'::name AS nm,
        '{"a":[1,2,{"b":null}]}'::json AS j, '{"z":1,"a":2.5}'::jsonb AS jb,
        'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid AS u,
        '2024-02-29'::date AS d, '13:45:30.5'::time AS tm,
        '2024-02-29 13:45:30.123456'::timestamp AS ts,
        '2024-02-29 13:45:30+02'::timestamptz AS tstz,
        'infinity'::timestamp AS ts_inf,
        '\x00ff10'::bytea AS bytes,
        ARRAY[1, NULL, 3]::int[] AS ai,
        ARRAY[['a', 'b'], ['c,d', 'e"f']]::text[] AS a2,
        '{}'::int[] AS a_empty,
        ARRAY['2024-01-01'::date] AS a_date,
        ARRAY['{"x":1}'::jsonb] AS a_jsonb,
        ARRAY[1.10, 2]::numeric[] AS a_num
    "#}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let row = &r.body["rows"][0];
    let expect = json!({
        "null_int": null, "b": true,
        "i2": 32767, "i4": -2147483648i64,
        "i8_safe": 9007199254740991i64, "i8_big": "9007199254740993",
        "i8_min": "-9223372036854775808",
        "f4": 1.5, "f8": 1.2345678901234567_f64,
        "f8_nan": "NaN", "f8_ninf": "-Infinity",
        "num": "12345678901234567890.123456789012345678901234567890",
        "num_nan": "NaN", "num_small": "0.000012",
        "t": "héllo ✓", "vc": "v", "bp": "ab  ", "nm": "nm",
        "j": {"a": [1, 2, {"b": null}]}, "jb": {"a": 2.5, "z": 1},
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "d": "2024-02-29", "tm": "13:45:30.500",
        "ts": "2024-02-29T13:45:30.123456",
        "tstz": "2024-02-29T11:45:30Z",
        "ts_inf": "infinity",
        "bytes": "AP8Q",
        "ai": [1, null, 3],
        "a2": [["a", "b"], ["c,d", "e\"f"]],
        "a_empty": [],
        "a_date": ["2024-01-01"],
        "a_jsonb": [{"x": 1}],
        "a_num": ["1.10", "2"]
    });
    for (col, want) in expect.as_object().expect("object") {
        assert_eq!(&row[col], want, "column {col}");
    }
    assert_eq!(
        row.as_object().expect("row").len(),
        expect.as_object().expect("o").len()
    );
}

#[test]
fn numeric_text_matches_postgres_own_rendering() {
    let stack = common::Stack::start();
    let r = stack
        .client
        .query(json!({"sql": r#"SELECT x, x::text AS want FROM (VALUES
        (0::numeric), (-0.5), (0.0001), (1e-20), (123456789.000), (1e30), (-99999.99990),
        (10000), (9999.9999), (0.10), ('Infinity'), ('-Infinity'),
        (round(pi()::numeric, 40)), (2::numeric ^ 200)
    ) AS v(x)"#}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let rows = r.body["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 14);
    for row in rows {
        assert_eq!(row["x"], row["want"]);
    }
}

#[test]
fn enums_and_domains_map_as_their_base() {
    let stack = common::Stack::start();
    stack
        .pg
        .client()
        .batch_execute(
            "CREATE TYPE mood AS ENUM ('ok', 'sad'); \
             CREATE DOMAIN posint AS int CHECK (VALUE > 0);",
        )
        .expect("types");
    let r = stack
        .client
        .query(json!({"sql": "SELECT 'sad'::mood AS m, 5::posint AS p, ARRAY['ok'::mood] AS ms"}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["rows"][0], json!({"m": "sad", "p": 5, "ms": ["ok"]}));
}

#[test]
fn parameters_bind_to_the_statement_types() {
    let stack = common::Stack::start();
    let r = stack.client.query(json!({
        "sql": "SELECT $1::int4 AS a, $2::text AS b, $3::bool AS c, $4::numeric AS d, \
                $5::jsonb AS e, $6::int[] AS f, $7::bytea AS g, $8::timestamptz AS h, \
                $9::uuid AS i, $10::float8 AS j, $11::text AS k, $12::int8 AS l, \
                $13::text[] AS m, $14::date AS n, $15::json AS o",
        "params": [42, "x", true, "1.10", {"k": [1]}, [1, 2, null], "AP8Q",
                   "2024-01-01T00:00:00Z", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", 2.5, null,
                   "9007199254740993", ["a,b", "c\"d", null], "2024-12-31", [1, "two"]]
    }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body["rows"][0],
        json!({
            "a": 42, "b": "x", "c": true, "d": "1.10", "e": {"k": [1]}, "f": [1, 2, null],
            "g": "AP8Q", "h": "2024-01-01T00:00:00Z",
            "i": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "j": 2.5, "k": null,
            "l": "9007199254740993", "m": ["a,b", "c\"d", null], "n": "2024-12-31",
            "o": [1, "two"]
        })
    );
    // Against a table column, with the type inferred from the column.
    let r = stack.client.query(json!({
        "sql": "SELECT name FROM items WHERE id = ANY($1) ORDER BY id",
        "params": [[3, 1, 2]]
    }));
    assert_eq!(
        r.body["rows"],
        json!([{"name": "item 1"}, {"name": "item 2"}, {"name": "item 3"}])
    );
}

#[test]
fn parameter_mistakes_are_400_with_details() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let r = c.query(json!({"sql": "SELECT $1::int AS a", "params": ["abc"]}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.code(), "bad_params");
    assert_eq!(r.body["error"]["pg_code"], "22P02");

    let r = c.query(json!({"sql": "SELECT $1::int AS a, $2::int AS b", "params": [1]}));
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "bad_params");
    assert!(r.body["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("2 parameter"));

    let r = c.query(json!({"sql": "SELECT $1::int AS a", "params": [[1, 2]]}));
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "bad_params");

    let r = c.query(json!({"sql": "SELECT $1::bytea AS a", "params": ["not base64!"]}));
    assert_eq!(r.status, 400);
    assert!(r.body["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("params[0]"));

    let r = c.query(json!({"sql": "SELECT $1::int2 AS a", "params": [70000]}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["error"]["pg_code"], "22003");
}

#[test]
fn unsupported_column_types_are_named_never_null() {
    let stack = common::Stack::start();
    for sql in [
        "SELECT 1 AS fine, '1 day'::interval AS span",
        "SELECT '1 day'::interval AS span WHERE false",
    ] {
        let r = stack.client.query(json!({"sql": sql}));
        assert_eq!(r.status, 422, "{sql}: {:?}", r.body);
        assert_eq!(r.code(), "unsupported_type");
        let msg = r.body["error"]["message"].as_str().expect("message");
        assert!(msg.contains("span") && msg.contains("interval"), "{msg}");
    }
    let r = stack
        .client
        .query(json!({"sql": "SELECT ARRAY['(1,2)'::point] AS pts"}));
    assert_eq!(r.status, 422);
    assert!(r.body["error"]["message"]
        .as_str()
        .expect("m")
        .contains("point"));
}
