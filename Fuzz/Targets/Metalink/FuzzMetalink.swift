import Foundation
import PackFuzzHarness

/// libFuzzer's entry point (built only with PACKS_FUZZ=1 and -sanitize=fuzzer; run by scripts/fuzz metalink):
/// the input is a `.meta4` file, in any encoding; a broken promise is a crash.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMetalink(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let outcome = FuzzHarness.metalink(data)
    if !outcome.problems.isEmpty { fatalError(outcome.problems.joined(separator: "; ")) }
    return 0
}
