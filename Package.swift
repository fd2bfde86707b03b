// swift-tools-version:6.2
import PackageDescription

/// The dependencies of the `packs` tool, `PackServer` and the tests, and only theirs. They are behind the
/// `Tools` trait, on by default; an app that depends on the library alone turns it off
/// (`.package(name: "PackDelivery", path: "…", traits: [])`) and resolves only GRDB, swift-log and
/// swift-collections: 3 packages instead of 27 (see the README).
let tools: TargetDependencyCondition? = .when(traits: ["Tools"])

let package = Package(
    name: "PackDelivery",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "PackDelivery", targets: ["PackDelivery"]),
        .library(name: "PackServer", targets: ["PackServer"]),
        .executable(name: "packs", targets: ["packs"]),
    ],
    traits: [
        .default(enabledTraits: ["Tools"]),
        .trait(name: "Tools", description: "The packs command-line tool, PackServer and what the tests need."),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        // Already in the graph through Hummingbird; named so PackServer can add channel handlers
        // (timeouts, connection limit, 431) below Hummingbird's router.
        .package(url: "https://github.com/apple/swift-nio", from: "2.81.0"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.24.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.3.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        // `packs serve --metrics-address`: counters through swift-metrics, exported as Prometheus text.
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // Already in the graph through swift-prometheus; named for the lock-free lazy metric slots.
        .package(url: "https://github.com/apple/swift-atomics", from: "1.3.0"),
        // `scripts/docs`: `swift package generate-documentation`, the DocC catalog as a static site. A plugin no
        // target uses: an app that depends on the library does not resolve it (Examples/StoreClient).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // libcurl: one typed wrapper per argument kind of the variadic setopt/getinfo calls; no logic.
        .target(
            name: "CCurl",
            linkerSettings: [.linkedLibrary("curl")]
        ),
        // Linux calls Swift's Glibc module does not import (renameat2).
        .target(name: "CLinux"),
        // libarchive and OpenSSL's libcrypto (SHA-256) as system libraries from Debian.
        .systemLibrary(
            name: "CArchive",
            pkgConfig: "libarchive",
            providers: [.apt(["libarchive-dev"])]
        ),
        // libzstd and zlib from Debian: a chunked pack's zstd frames, gzip members and seek table.
        .systemLibrary(
            name: "CCompression",
            pkgConfig: "libzstd",
            providers: [.apt(["libzstd-dev", "zlib1g-dev"])]
        ),
        .systemLibrary(
            name: "CCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .target(
            name: "PackDelivery",
            dependencies: [
                "CCurl", "CArchive", "CCompression", "CCrypto", "CLinux",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HeapModule", package: "swift-collections"),
            ]
        ),
        .target(
            name: "PackServer",
            dependencies: [
                // Receipts are checked with the library's Ed25519 (OpenSSL), as signed manifests are.
                "PackDelivery",
                .product(name: "Hummingbird", package: "hummingbird", condition: tools),
                .product(name: "HummingbirdCore", package: "hummingbird", condition: tools),
                .product(name: "NIOCore", package: "swift-nio", condition: tools),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: tools),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras", condition: tools),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras", condition: tools),
                .product(name: "HTTPTypes", package: "swift-http-types", condition: tools),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: tools),
                .product(name: "Logging", package: "swift-log", condition: tools),
                .product(name: "CoreMetrics", package: "swift-metrics", condition: tools),
                .product(name: "Prometheus", package: "swift-prometheus", condition: tools),
                .product(name: "Atomics", package: "swift-atomics", condition: tools),
            ]
        ),
        // `packs agent`: the per-user service that owns the queues of the homes it serves, with a JSON API over
        // HTTP on a Unix socket (Sources/PackAgent/agent-openapi.yaml describes it).
        .target(
            name: "PackAgent",
            dependencies: [
                "PackDelivery", "CLinux",
                .product(name: "Hummingbird", package: "hummingbird", condition: tools),
                .product(name: "HummingbirdCore", package: "hummingbird", condition: tools),
                .product(name: "NIOCore", package: "swift-nio", condition: tools),
                .product(name: "NIOPosix", package: "swift-nio", condition: tools),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras", condition: tools),
                .product(name: "HTTPTypes", package: "swift-http-types", condition: tools),
                .product(name: "Logging", package: "swift-log", condition: tools),
            ],
            exclude: ["agent-openapi.yaml"]
        ),
        .executableTarget(
            name: "packs",
            dependencies: [
                "PackDelivery", "PackServer", "PackAgent", "CLinux",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: tools),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // One fuzz input in a sandbox, and the checks of what must hold after it; shared by the fuzz targets
        // below and by the corpus tests, so the suite replays the saved inputs exactly as the fuzzers ran them.
        .target(
            name: "PackFuzzHarness",
            dependencies: ["PackDelivery"],
            path: "Fuzz/Harness"
        ),
        // glibc's <malloc.h> (mallinfo2) for the tests that replay saved memory leaks.
        .systemLibrary(name: "CMalloc", path: "Tests/CMalloc"),
        .target(
            name: "PackTestSupport",
            dependencies: [],
            path: "Tests/PackTestSupport"
        ),
        .testTarget(
            name: "PackDeliveryTests",
            dependencies: [
                "PackDelivery", "PackServer", "PackAgent", "PackTestSupport", "PackFuzzHarness", "CMalloc",
                .product(name: "Logging", package: "swift-log"),
                // app.test(.router) for the server's middleware, without sockets.
                .product(name: "HummingbirdTesting", package: "hummingbird", condition: tools),
            ],
            // Packs of earlier writers, read from the source tree by the tests that replay them.
            exclude: ["Fixtures"]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// libFuzzer targets, only when PACKS_FUZZ=1 (scripts/fuzz sets it and builds them with -sanitize=fuzzer,address
// into .build-fuzz). They have no main of their own, only LLVMFuzzerTestOneInput: libFuzzer supplies main, so a
// normal `swift build` or `swift test`, which links no libFuzzer, could not link them.
if Context.environment["PACKS_FUZZ"] == "1" {
    for name in [
        "FuzzManifest", "FuzzInspect", "FuzzUnpack", "FuzzIndex", "FuzzReceiptHeader", "FuzzReceiptClaims", "FuzzPrintable",
        "FuzzMetalink",
    ] {
        package.targets.append(
            .executableTarget(
                name: name,
                dependencies: ["PackFuzzHarness"],
                path: "Fuzz/Targets/\(name.dropFirst("Fuzz".count))"
            ))
    }
}
