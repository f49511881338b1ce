# frozen_string_literal: true

require "test_helper"

# CHANGELOG.md keeps the Keep a Changelog layout: a section per version, newest first, the current
# version (Evt::VERSION) among them, and only the standard kinds of change under each.
class ChangelogTest < Minitest::Test
  PATH = File.expand_path("../CHANGELOG.md", __dir__)
  KINDS = %w[Added Changed Deprecated Removed Fixed Security].freeze

  def sections
    File.read(PATH).scan(/^## (.+)$/).flatten
  end

  def test_every_section_is_a_version_or_unreleased
    refute_empty sections
    sections.each do |heading|
      assert_match(/\A\[(Unreleased|\d+\.\d+\.\d+)\]( - \d{4}-\d{2}-\d{2})?\z/, heading, "not a version heading")
    end
  end

  def test_the_current_version_has_a_dated_section_and_versions_go_newest_first
    assert(sections.any? { |h| h.match?(/\A\[#{Regexp.escape(Evt::VERSION)}\] - \d{4}-\d{2}-\d{2}\z/) },
           "CHANGELOG.md has no dated section for #{Evt::VERSION}")
    versions = sections.filter_map { |h| h[/\A\[(\d+\.\d+\.\d+)\]/, 1] }.map { |v| Gem::Version.new(v) }
    assert_equal versions.sort.reverse, versions, "versions must go newest first"
  end

  def test_changes_are_filed_under_the_standard_kinds
    File.read(PATH).scan(/^### (.+)$/).flatten.each { |kind| assert_includes KINDS, kind }
  end
end
