/// A value kept out of line, in a box of its own, and copied on write: a value type whose field is large and mostly
/// the same (or unused) holds one word for it instead.
///
/// A queue keeps a ``DownloadMachine`` for each of its downloads, and a machine's state for running (its facts, rate,
/// source failures) and a download's error are large; 100,000 waiting downloads (case 19 of the benchmark) would hold
/// them inline, each unused. Copies share the box until one of them is changed.
struct OutOfLine<Value: Sendable & Hashable>: Sendable, Hashable {
    /// One value, shared by copies until one of them writes.
    private final class Box: @unchecked Sendable {
        // @unchecked Sendable: `value` (itself Sendable) is written only through `OutOfLine.value`'s `_modify`, which first
        // makes the box unique (`isKnownUniquelyReferenced`, else a copy). A box reachable from two copies, and so
        // perhaps from two threads, is therefore only ever read; a box that is written is owned by one copy, and so by
        // whoever owns that copy.
        var value: Value
        init(_ value: Value) { self.value = value }
    }

    private var box: Box

    init(_ value: Value) { self.box = Box(value) }

    var value: Value {
        get { self.box.value }
        _modify {
            if !isKnownUniquelyReferenced(&self.box) { self.box = Box(self.box.value) }
            yield &self.box.value
        }
    }

    static func == (a: Self, b: Self) -> Bool { a.box === b.box || a.box.value == b.box.value }
    func hash(into hasher: inout Hasher) { self.box.value.hash(into: &hasher) }
}
