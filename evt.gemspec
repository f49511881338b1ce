# frozen_string_literal: true

require_relative "lib/evt/version"

Gem::Specification.new do |spec|
  spec.name = "evt"
  spec.version = Evt::VERSION
  spec.authors = ["The evt developers"]
  spec.summary = "A fast Fiber Scheduler for CRuby on io_uring, epoll, poll and IO.select"
  spec.description = <<~TEXT
    evt makes every blocking operation in a non-blocking fiber (sockets, pipes, sleeps, queues,
    mutexes) yield to other fibers while the OS waits, through a small C event loop on the fastest
    mechanism the platform has.
  TEXT
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.3"

  spec.files = Dir["lib/**/*.rb", "ext/**/*.{c,h,rb}", "sig/**/*.rbs", "README.md", "CHANGELOG.md", "LICENSE"]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/evt/extconf.rb"]
end
